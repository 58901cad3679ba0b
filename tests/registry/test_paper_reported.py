"""The algorithms' own published numbers in the registry: every row of a paper's (or its authors' repo's) table is
the cell of tests/fixtures/docs/paper-tables.md it claims (parsed there, not retyped here), carries that section's
source, and lives in that table's own id, never in DARE's; no table id holds rows of two sources."""

import re

import pytest

from dare_bench.registry import load_registry

from testpaths import PAPER_TABLES

TASK = {"GSM8K": "gsm8k", "GSM8k": "gsm8k", "MATH500": "math500", "Math500": "math500", "Countdown": "countdown",
        "Sudoku": "sudoku", "HumanEval": "humaneval", "MBPP": "mbpp"}  # LLaDA 1.5's "Math" is full MATH: no row

# per table id: the reproductions' algorithm-backbone, the row label -> settings of the rows it gives (None: a row
# that is context only, e.g. the base model), and the setting a column's second word names (with its type)
TABLES = {
    "d1-paper-table1": ("d1-llada", {"+diffu-GRPO": {"model": "LLaDA-8B-Instruct + diffu-GRPO"},
                                     "+SFT+diffu-GRPO (d1-LLaDA)":
                                         {"model": "d1-LLaDA: LLaDA-8B-Instruct + SFT (s1k) + diffu-GRPO"}},
                        ("gen_length", int)),
    "llada1.5-eval": ("vrpo-llada", {"**Internal toolkit**": {"toolkit": "internal"},
                                     "**OpenCompass**": {"toolkit": "opencompass"}}, None),
    "spg-paper-figure1": ("spg-llada", {"SPG (ours)": {"gen_length": 256, "steps": 128}}, None),
    "dtreerpo-paper-table1": ("dtreerpo-llada", {"+ d-TreeRPO (ours)": {}}, ("gen_length", int)),
    "trado-paper-table2": ("tracerl-sdar", {"TraDo-8B-Instruct": {}}, ("sampling", str)),
    "wd1-readme-figure": ("wd1-llada", {"wd1 (ours)": {}}, None),
    "gdpo-readme-figure": ("gdpo-llada", {"GDPO (Ours)": {}}, None),
}
# cells of an algorithm's own row whose benchmark has no reproduction of that algorithm here (listed, not dropped
# silently)
NOT_IN_REGISTRY = {"gdpo-readme-figure": {"gdpo-llada-humaneval", "gdpo-llada-mbpp"}}
OTHER_TABLES = {"dare-algorithm-comparison", "dare-eval-reproduction", "justgrpo-results"}  # test_registry_coverage


@pytest.fixture(scope="module")
def doc() -> str:
    return PAPER_TABLES.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def reg():
    return load_registry()


def _section(doc: str, table_id: str) -> str:
    assert f"\n## {table_id}\n" in doc, table_id
    return doc.split(f"\n## {table_id}\n", 1)[1].split("\n## ", 1)[0]


def _grid(section: str) -> tuple[list[str], list[list[str]]]:
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in section.splitlines()
            if ln.startswith("|")]
    assert len(rows) >= 3, section[:200]
    return rows[0], rows[2:]  # rows[1] is the |---| separator


def _source(section: str) -> tuple[str, str, str]:
    m = re.search(r"Source: `([^`]+)` @ `([0-9a-f]+)`[^`]*`([^`]+)`", section)
    assert m, section[:200]
    return m.groups()


def _cells(doc: str, table_id: str):
    """(reproduction, settings to match, printed value) for every cell of the table's YAML rows."""
    prefix, row_settings, column_setting = TABLES[table_id]
    header, rows = _grid(_section(doc, table_id))
    by_label = {row[0]: row for row in rows}
    for label, settings in row_settings.items():
        row = by_label[label]
        for col, cell in zip(header[1:], row[1:]):
            bench, *rest = col.split()
            if bench not in TASK:
                continue
            want = dict(settings)
            if column_setting:
                key, cast = column_setting
                want[key] = cast(rest[0])
            if table_id == "llada1.5-eval":  # the table's own settings rows name each column's length and block
                for key in ("gen_length", "block_length"):
                    want[key] = int(by_label[f"**{key}**"][header.index(col)])
            yield f"{prefix}-{TASK[bench]}", want, float(cell)


@pytest.mark.parametrize("table_id", list(TABLES))
def test_every_cell_is_in_its_reproduction_with_its_source(doc, reg, table_id):
    ref, commit, file = _source(_section(doc, table_id))
    checked, absent = 0, set()
    for name, settings, value in _cells(doc, table_id):
        if name not in reg.names():
            absent.add(name)
            continue
        hits = [r for r in reg.get(name).reported
                if r.table == table_id and all(r.settings.get(k) == v for k, v in settings.items())]
        assert len(hits) == 1, (name, settings, reg.get(name).reported)
        (r,) = hits
        assert r.value == value, (name, settings)
        assert (r.source.kind, r.source.ref, r.source.commit, r.source.file) == ("repo", ref, commit, file)
        checked += 1
    assert absent == NOT_IN_REGISTRY.get(table_id, set())
    in_registry = sum(r.table == table_id for spec in reg for r in spec.reported)
    assert checked == in_registry > 0  # no row of this table id that the source does not print


def test_table_ids_are_known_and_never_mix_sources(reg):
    sources: dict[str, set] = {}
    for spec in reg:
        for r in spec.reported:
            assert r.table in TABLES or r.table in OTHER_TABLES, (spec.name, r.table)
            sources.setdefault(r.table, set()).add((r.source.ref, r.source.commit, r.source.file))
    # one document per table id (DARE's comparison id spans its README's LLaDA and Dream tables: one file)
    assert all(len(s) == 1 for s in sources.values()), sources


def test_headers_name_every_reported_source(reg):
    for spec in reg:
        head = reg.files[spec.name].read_text().split("\nname:", 1)[0]
        for r in spec.reported:
            if r.table in TABLES:
                assert r.source.ref in head and "# Reported:" in head, (spec.name, r.source.ref)

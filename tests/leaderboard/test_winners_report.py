"""`dare-bench winners`: the README's winners table is generated from the shipped bundle (and current), and the
table / image / README block come out right on a store with known winners."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dare_bench.cli import app
from dare_bench.errors import ConfigError
from dare_bench.leaderboard.report import (
    END,
    START,
    markdown_table,
    superseded_counts,
    update_readme,
    winners_rows,
)

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.mark.integration
def test_the_readme_block_is_the_shipped_bundles_table(tmp_path, monkeypatch):
    monkeypatch.setenv("DARE_BENCH_HOME", str(tmp_path))
    from dare_bench.pipeline.shared_bases import bundle_base_hashes
    from dare_bench.store.bundle import SHIPPED, merged_database

    url = merged_database([SHIPPED], None)["url"]
    expected = markdown_table(winners_rows(url, scale="tiny", shipped_bases=bundle_base_hashes([SHIPPED])), "tiny",
                              superseded_counts(url, scale="tiny"))
    readme = (REPO / "README.md").read_text()
    block = readme.split(START, 1)[1].split(END, 1)[0]
    assert block.endswith(expected), "README winners block is stale: run `dare-bench winners --readme README.md " \
                                     "--image docs/winners.png`"
    assert "![winners](docs/winners.png)" in block and (REPO / "docs" / "winners.png").is_file()


def test_winners_table_image_and_readme_block(winners_db, tmp_path):
    rows = json.loads(runner.invoke(app, ["winners", "--db", winners_db, "--scale", "micro", "--json"]).stdout)
    llada = next(r for r in rows if r["backbone"] == "llada")
    assert (llada["winner"], llada["runner-up"], llada["margin"], llada["CIs separate"]) == ("d1", "sft", "+0.200",
                                                                                          "no")
    assert llada["score"].startswith("0.450 ± ") and llada["score"].endswith("(n=2)")
    assert llada["vs base"].startswith("+0.350 ± ")  # finals 0.40 / 0.50 from bases at 0.1
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{START}\nold\n{END}\n\nafter\n")
    image = tmp_path / "docs" / "w.png"
    image.parent.mkdir()
    out = runner.invoke(app, ["winners", "--db", winners_db, "--scale", "micro", "--readme", str(readme),
                              "--image", str(image)])
    assert out.exit_code == 0, out.output
    text = readme.read_text()
    assert "| llada | sudoku | d1 | 0.450 ± " in text and "![winners](docs/w.png)" in text and "old" not in text
    assert text.endswith(f"{END}\n\nafter\n") and image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not update_readme(readme, markdown_table(winners_rows(winners_db, scale="micro"), "micro"),
                             "docs/w.png")  # already current



def test_the_image_draws_every_character_with_a_glyph_of_its_font(winners_db):
    # the built-in font lacks "—" (a row without a runner-up or a control): drawn as is, it is a missing-glyph box
    from dare_bench.leaderboard.report import COLUMNS, image_font, image_text

    font = image_font()
    missing = bytes(font.getmask("\U0001F600"))  # what a character the font lacks draws
    assert bytes(font.getmask("—")) == missing
    rows = winners_rows(winners_db, scale="micro")
    drawn = set("".join([*COLUMNS, "dare-bench winners, tiny scale", image_text("— –")]
                        + [image_text(r[c]) for r in rows for c in COLUMNS]))
    assert "-" in drawn and not {c for c in drawn if bytes(font.getmask(c)) == missing}
    assert font.getlength(" ") >= 3  # at the default 10 px a space is 2 px: "CIs separate" read as one word

def test_a_task_on_two_bases_names_the_cpu_each_base_came_from(tmp_path):
    from dare_bench.store import Store

    from lb_helpers import add_run

    url = f"sqlite:///{tmp_path / 'two-bases.db'}"
    store = Store(url)
    epyc = {"cpu": "AMD EPYC", "cpu_id": "AuthenticAMD family 25 model 1 stepping 1", "cpu_isa": "AVX2"}
    xeon = {"cpu": "Intel(R) Xeon(R) Processor"}  # recorded before the family / ISA were kept
    for seed, final in enumerate((0.5, 0.6)):
        add_run(store, "d1", final, seed=seed, base_sha="a" * 64, hardware=epyc)
        add_run(store, "d1", final - 0.2, seed=seed, base_sha="b" * 64, hardware=xeon)
    add_run(store, "d1", 0.9, seed=0, backbone="dream", base_sha="c" * 64, hardware=epyc)  # one base: no footnote
    store.close()
    rows = winners_rows(url, scale="micro")
    by_task = {(r["backbone"], r["task"]): r for r in rows}
    assert by_task[("llada", "sudoku @ aaaaaaaa")]["base machine"] == \
        "AMD EPYC (AuthenticAMD family 25 model 1 stepping 1, AVX2)"
    assert by_task[("llada", "sudoku @ bbbbbbbb")]["base machine"] == "Intel(R) Xeon(R) Processor"
    table = markdown_table(rows, "micro")
    assert table.rstrip().endswith("The CPU that trained each base: aaaaaaaa AMD EPYC (AuthenticAMD family 25 "
                                   "model 1 stepping 1, AVX2); bbbbbbbb Intel(R) Xeon(R) Processor._")
    assert "cccccccc" not in table
    one_base = [r for r in rows if r["backbone"] == "dream"]
    assert "The CPU that trained each base" not in markdown_table(one_base, "micro")


def test_a_shared_base_is_named_by_the_cpu_that_trained_it_not_by_a_later_run(tmp_path):
    """A base shipped in a bundle is used on other machines: its identity's `trained_on` names the CPU, whatever
    the order of the runs in the store."""
    from dare_bench.leaderboard import data
    from dare_bench.store import Store

    from lb_helpers import add_run

    url = f"sqlite:///{tmp_path / 'shared.db'}"
    store = Store(url)
    xeon = {"cpu": "Intel(R) Xeon(R) Processor", "cpu_isa": "AVX512"}
    epyc = {"cpu": "AMD EPYC", "cpu_id": "AuthenticAMD family 25 model 1 stepping 1", "cpu_isa": "AVX2"}
    add_run(store, "d1", 0.5, seed=0, base_sha="d" * 64, hardware=xeon, trained_on=epyc)  # ingested first
    add_run(store, "d1", 0.6, seed=1, base_sha="d" * 64, hardware=epyc, trained_on=epyc)
    add_run(store, "d1", 0.4, seed=0, backbone="dream", base_sha="e" * 64, hardware=xeon)  # an older record
    store.close()
    engine = data.open_reader(url)
    machines = data.base_machines(engine, scale="micro")
    engine.dispose()
    assert machines["d" * 64] == "AMD EPYC (AuthenticAMD family 25 model 1 stepping 1, AVX2)"
    assert machines["e" * 64] == "Intel(R) Xeon(R) Processor (AVX512)"


def test_rows_whose_base_ships_in_the_bundle_are_named(tmp_path):
    import json

    from dare_bench.pipeline.shared_bases import bundle_base_hashes
    from dare_bench.store import Store

    from lb_helpers import add_run

    url = f"sqlite:///{tmp_path / 'shipped.db'}"
    store = Store(url)
    for seed in (0, 1):
        add_run(store, "d1", 0.5 + 0.1 * seed, seed=seed, base_sha="a" * 64)
        add_run(store, "d1", 0.4, seed=seed, backbone="dream", base_sha="c" * 64)
    store.close()
    record = tmp_path / "bundle" / "bases" / "llada-sudoku-micro-0123456789abcdef" / "base.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"key": {}, "identity": {"weights_sha256": "a" * 64}}))
    shipped = bundle_base_hashes([tmp_path / "bundle"])
    assert shipped == {"a" * 64}
    rows = winners_rows(url, scale="micro", shipped_bases=shipped)
    assert {(r["backbone"], r["base shipped"]) for r in rows} == {("llada", True), ("dream", False)}
    assert markdown_table(rows, "micro").rstrip().endswith("runs from it on any machine join the row): "
                                                           "llada sudoku._")
    assert "ships in the bundle" not in markdown_table(winners_rows(url, scale="micro"), "micro")


def test_a_readme_without_the_markers_is_one_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no block\n")
    with pytest.raises(ConfigError, match="has no winners block"):
        update_readme(readme, "x", None)

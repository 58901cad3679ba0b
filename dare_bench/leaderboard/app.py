"""dare-bench leaderboard: which post-training algorithm wins per backbone, reported vs reproduced, with curves.

What it does: a read-only Streamlit app over the results store. An overview answers the question at a glance (per
backbone × task at one scale: the winner, its margin over the runner-up, whether their CIs separate). For one
backbone and ONE scale at a time it shows the algorithm × task matrix of final scores (mean, 95 % CI over seeds,
number of runs, winner starred; gains over the base and over a compute-matched SFT control), stability (reward
with seed bands, reward-collapse flags, the ELBO methods' MC-sample sensitivity), score against tokens per forward,
the paper's reported values next to ours (ours ×100: the store keeps fractions, papers print percentages), training
curves (reward, loss, KL, tokens per forward) overlaid per algorithm with the per-stage time breakdown, and a
drill-down into one run (resolved config, run record, sampler preset, a page of per-sample outputs).

    dare-bench leaderboard                                   # DARE_BENCH_DB or $DARE_BENCH_HOME/results.db
    dare-bench leaderboard --db results.db --port 8501       # binds 127.0.0.1 unless --host says otherwise
    DARE_BENCH_DB=sqlite:///results.db streamlit run leaderboard/app.py   # the same app, by hand

No GPU and no torchrun: it only reads the database (SQLite is opened with mode=ro), so CPU, one-GPU and multi-GPU
machines run it the same way. The queries live in `dare_bench/leaderboard/data.py`.
"""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dare_bench.errors import DareBenchError
from dare_bench.leaderboard import data

MAX_RUNS_OVERLAID = 12  # beyond this an overlay is unreadable; the mean per algorithm is the view for many runs
TTL_S = 30  # new runs show up within this long, without hammering the database on every widget change
CURVE_LABELS = {"reward_mean": "reward", "loss": "loss", "kl": "KL", "tokens_per_forward": "tokens per forward",
                "entropy": "entropy", "reward_std": "reward std", "peak_memory_mb": "peak memory (MB)"}


@st.cache_resource(show_spinner=False)
def _engine(url: str):
    return data.open_reader(url)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _overview(url: str) -> dict:
    return data.overview(_engine(url))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _scales(url: str, backbone: str) -> list[str]:
    return data.scales_for(_engine(url), backbone)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _facets(url: str, backbone: str, scale: str) -> dict:
    return data.facets(_engine(url), backbone, scale)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _winners(url: str, backbone: str, scale: str, tasks: tuple, algorithms: tuple, modified: bool) -> pd.DataFrame:
    return data.winners(_engine(url), backbone=backbone, scale=scale, tasks=list(tasks), algorithms=list(algorithms),
                        include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _overview_table(url: str, scale: str, modified: bool) -> pd.DataFrame:
    return data.winners_overview(_engine(url), scale=scale, include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _seed_bands(url: str, backbone: str, task: str, scale: str, modified: bool) -> pd.DataFrame:
    return data.seed_bands(_engine(url), backbone=backbone, task=task, scale=scale, include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _collapses(url: str, backbone: str, task: str, scale: str, drop: float, modified: bool) -> pd.DataFrame:
    return data.reward_collapses(_engine(url), backbone=backbone, task=task, scale=scale, drop=drop,
                                 include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _mc(url: str, backbone: str, task: str, scale: str) -> pd.DataFrame:
    return data.mc_sensitivity(_engine(url), backbone=backbone, task=task, scale=scale)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _tpf(url: str, backbone: str, scale: str, modified: bool) -> pd.DataFrame:
    return data.accuracy_vs_tpf(_engine(url), backbone=backbone, scale=scale, include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _eval_reproduction(url: str, modified: bool) -> pd.DataFrame:
    return data.eval_reproduction(_engine(url), include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _released_runs(url: str, modified: bool) -> pd.DataFrame:
    return data.released_runs(_engine(url), include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _reported(url: str, backbone: str) -> tuple[pd.DataFrame, str]:
    return data.reported_scores(_engine(url), backbone)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _curves(url: str, backbone: str, task: str, scale: str, algorithms: tuple, modified: bool) -> pd.DataFrame:
    return data.curves(_engine(url), backbone=backbone, task=task, scale=scale, algorithms=list(algorithms),
                       include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _run_curve(url: str, run_id: int) -> pd.DataFrame:
    return data.run_curve(_engine(url), run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _stages(url: str, backbone: str, task: str, scale: str, algorithms: tuple, modified: bool) -> pd.DataFrame:
    return data.stage_times(_engine(url), backbone=backbone, task=task, scale=scale, algorithms=list(algorithms),
                            include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _runs(url: str, backbone: str, task: str, scale: str, algorithms: tuple, modified: bool) -> pd.DataFrame:
    return data.runs_page(_engine(url), backbone=backbone, task=task, scale=scale, algorithms=list(algorithms),
                          include_modified=modified)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _detail(url: str, run_id: int) -> dict | None:
    return data.run_detail(_engine(url), run_id)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _samples(url: str, evaluation_id: int, page: int, only: str) -> tuple[pd.DataFrame, int]:
    return data.samples_page(_engine(url), evaluation_id, page=page, only=only)


def _highlight_best(matrix: pd.DataFrame) -> pd.io.formats.style.Styler:
    def style(df: pd.DataFrame) -> pd.DataFrame:
        return df.map(lambda v: "background-color: #c8f7c5; font-weight: 700" if str(v).startswith("★") else "")

    return matrix.style.apply(style, axis=None)


def main() -> None:
    st.set_page_config(page_title="dare-bench leaderboard", layout="wide")
    st.title("dare-bench leaderboard")
    url = data.database_target()
    try:
        _engine(url)
        ov = _overview(url)
    except DareBenchError as exc:
        st.error(f"Cannot open the results database: {exc}")
        st.stop()
    shown = data.display_url(url)
    st.caption(f"Database: `{shown}` · {ov['finished']} finished runs of {ov['runs']} recorded · read-only")

    if not ov["finished"]:
        st.info(
            "**No finished runs yet** — this database holds nothing to rank. Record one with "
            f"`dare-bench reproduce d1-llada-sudoku --scale micro --db {shown}` and reload this page.",
            icon="📭",
        )
        st.stop()

    with st.sidebar:
        st.header("Filters")
        backbone = st.selectbox("Backbone", ov["backbones"], key="backbone")
        scales = _scales(url, backbone)
        scale = st.selectbox("Scale", scales, key="scale",
                             help="Scales are never mixed: paper, tiny and micro numbers are not comparable.")
        choices = _facets(url, backbone, scale)
        # A choice made for another backbone or scale is dropped, not turned into an error or an empty page.
        for key, options in (("tasks", choices["tasks"]), ("algorithms", choices["algorithms"])):
            if key in st.session_state:
                st.session_state[key] = [v for v in st.session_state[key] if v in options]
        tasks = st.multiselect("Tasks", choices["tasks"], key="tasks", placeholder="all tasks")
        algorithms = st.multiselect("Algorithms", choices["algorithms"], key="algorithms",
                                    placeholder="all algorithms")
        modified = st.checkbox("Include modified runs (key=value overrides, or a config the registry has since "
                               "changed)", value=False, key="modified")

    cells = _winners(url, backbone, scale, tuple(tasks), tuple(algorithms), modified)
    tab_over, tab_win, tab_rep, tab_eval, tab_curves, tab_stab, tab_tpf, tab_run = st.tabs(
        ["Overview", "Winners", "Reported vs reproduced", "Evaluation reproduction", "Curves", "Stability",
         "Speed vs quality", "Run drill-down"])

    with tab_over:
        st.subheader(f"Which algorithm wins — every backbone, {scale} scale")
        over = _overview_table(url, scale, modified)
        if over.empty:
            st.info(f"No finished {scale}-scale runs to rank.")
        else:
            st.caption("Per backbone × task: the best mean final score (baseline left out), the runner-up, the "
                       "margin, and whether the two 95 % CIs separate (n/a: a single run has no interval).")
            st.dataframe(over, width="stretch", hide_index=True,
                         column_config={"mean": st.column_config.NumberColumn(format="%.3f"),
                                        "ci95": st.column_config.NumberColumn("± 95 % CI", format="%.3f"),
                                        "margin": st.column_config.NumberColumn(format="%+.3f")})

    with tab_win:
        st.subheader(f"Winners — {backbone}, {scale} scale")
        if cells.empty:
            st.info(f"No finished {scale}-scale runs of {backbone} match these filters"
                    + ("" if modified else " (runs with key=value overrides, or of a config the registry has since "
                                           "changed, are hidden unless ticked in the sidebar)")
                    + ".")
        else:
            winners = data.task_winners(cells)
            best = cells[cells["best"]].drop_duplicates("group").set_index("group")["mean"]
            lines = [f"**{t}**: {', '.join(a)} ({best[t]:.3f})" for t, a in winners.items()]
            st.markdown("Best per task — " + " · ".join(lines))
            st.caption("Cell = mean of the primary metric (final evaluation) over runs ± 95 % CI (Student t over "
                       "seeds, shown when n > 1), n = runs behind the cell; ★ = best mean in the column "
                       "(higher is better). Baseline = the untrained backbone. Runs from different tiny bases "
                       "(weight hash) are never pooled: such a task gets a column per base.")
            matrix = data.winner_matrix(cells)
            st.dataframe(_highlight_best(matrix), width="stretch")
            st.markdown("**Gains** — over the base, and over a compute-matched SFT control (an SFT continuation "
                        "from the same base for the FLOPs the RL run counted: did RL beat more SFT?)")
            st.dataframe(data.gain_table(cells), width="stretch", hide_index=True)
            with st.expander("Cell statistics"):
                st.dataframe(cells[["algorithm", "task", "base", "metric", "n", "seeds", "mean", "std", "ci95",
                                    "min", "max", "best"]], width="stretch", hide_index=True)

    with tab_rep:
        st.subheader(f"Reported vs reproduced — {backbone}, {scale} scale")
        reported, origin = _reported(url, backbone)
        tables = sorted(reported["table"].unique()) if len(reported) else []
        if not tables:
            st.info(f"No reported scores for {backbone} in the store or the registry.")
        else:
            default = tables.index("dare-algorithm-comparison") if "dare-algorithm-comparison" in tables else 0
            table = st.selectbox("Published table", tables, index=default, key="reported_table",
                                 help="Rows of different published tables use different settings; never mix them.")
            cmp = data.reported_vs_reproduced(cells, reported, table, scale)
            if tasks:
                cmp = cmp[cmp["task"].isin(tasks)]
            if algorithms:
                cmp = cmp[cmp["algorithm"].isin(algorithms)]
            st.caption(
                "Units: the store keeps fractions (0..1); papers print percentages, so **reproduced = ours × 100** "
                "and difference = reproduced − reported, in percentage points. "
                f"Reported values come from the {origin}"
                + (" (`dare-bench ingest` syncs them into the store)" if origin == "registry" else "")
                + (f". Reported numbers are for the paper recipe: a {scale}-scale replica on a CPU-learnable task is "
                   "another experiment, so no difference is shown (status: not comparable)."
                   if scale not in data.PAPER_SCALES else "."))
            st.dataframe(
                cmp, width="stretch", hide_index=True,
                column_config={
                    "reported": st.column_config.NumberColumn("reported (%)", format="%.1f"),
                    "reproduced": st.column_config.NumberColumn("reproduced (%)", format="%.1f",
                                                                help="ours × 100, mean over runs"),
                    "ci95": st.column_config.NumberColumn("± 95 % CI", format="%.1f"),
                    "difference": st.column_config.NumberColumn("difference (pp)", format="%+.1f"),
                    "status": st.column_config.TextColumn("status", help="ok · no run (reported only) · no report"),
                    "source": st.column_config.TextColumn("source", help="repo/paper, commit, file, table"),
                },
            )

    with tab_eval:
        st.subheader("Evaluation reproduction — DARE's 12 benchmarks × 6 released models")
        st.caption("Released checkpoints under DARE's pinned OpenCompass settings (`released-<backbone>-<benchmark>`, "
                   "run with `dare-bench eval-suite BACKBONE`). Cell = ours / DARE's reported, in percent; [min–max, "
                   "k variants] = the spread over the protocol variants run for the cell (cache, block length, "
                   "threshold, ...: one variant per distinct sampler setting). Not filtered by the sidebar's "
                   "backbone or scale (paper scale only); modified runs (overrides, shrunk checkpoints) count only "
                   "when ticked in the sidebar.")
        cells_eval = _eval_reproduction(url, modified)
        st.dataframe(data.eval_reproduction_matrix(cells_eval), width="stretch")
        with_runs = cells_eval[cells_eval["runs"] > 0]
        if with_runs.empty:
            st.info("No runs of the evaluation table yet" + ("" if modified else " (modified runs are hidden)")
                    + ": `dare-bench eval-suite llada --checkpoint DIR` fills a column.")
        else:
            labels = {f"{r.model} · {r.benchmark}": (r.backbone, r.row) for r in with_runs.itertuples()}
            chosen = st.selectbox("Protocol variants of one cell", list(labels), key="eval_cell")
            backbone_c, row_c = labels[chosen]
            runs_eval = _released_runs(url, modified)
            st.dataframe(runs_eval[(runs_eval["backbone"] == backbone_c) & (runs_eval["row"] == row_c)]
                         [["run_id", "variant", "percent", "tokens_per_forward", "n_items", "modified", "seed"]],
                         width="stretch", hide_index=True)

    with tab_curves:
        st.subheader(f"Training curves — {backbone}, {scale} scale")
        curve_tasks = tasks or sorted(cells["task"].unique().tolist()) or ov["tasks"]
        task = st.selectbox("Task", curve_tasks, key="curve_task")
        mode = st.radio("Overlay", ["mean per algorithm", "selected runs"], horizontal=True, key="curve_mode")
        if mode == "mean per algorithm":
            curves = _curves(url, backbone, task, scale, tuple(algorithms), modified)
            series, note = "algorithm", "Mean over the runs of each algorithm"
        else:
            pool = _runs(url, backbone, task, scale, tuple(algorithms), modified)
            names = {int(r.run_id): f"#{r.run_id} {r.algorithm} seed {r.seed}" for r in pool.itertuples()}
            newest = list(pool.drop_duplicates("algorithm")["run_id"].astype(int))  # newest run per algorithm
            picked = st.multiselect("Runs", list(names), default=newest[:MAX_RUNS_OVERLAID], format_func=names.get,
                                    key="curve_runs", max_selections=MAX_RUNS_OVERLAID)
            frames = [_run_curve(url, rid).assign(run=names[rid]) for rid in picked]
            curves = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=["run"])
            series, note = "run", "Each selected run"
        if curves.empty or not any(c in curves and curves[c].notna().any() for c in data.CURVE_COLUMNS):
            st.info(f"No step metrics for {backbone} × {task} at {scale} scale (baseline runs do not train).")
        else:
            st.caption(f"{note}, downsampled in the database to at most {data.MAX_CURVE_POINTS} points per curve.")
            shown = [c for c in ("reward_mean", "loss", "kl", "tokens_per_forward") if curves[c].notna().any()]
            cols = st.columns(2)
            for i, metric in enumerate(shown):
                chart = (alt.Chart(curves.dropna(subset=[metric]))
                         .mark_line(point=len(curves) < 60)
                         .encode(x=alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1)),
                                 y=alt.Y(f"{metric}:Q", title=CURVE_LABELS[metric]),
                                 color=alt.Color(f"{series}:N"), tooltip=[series, "step", metric])
                         .properties(title=CURVE_LABELS[metric], height=240))
                cols[i % 2].altair_chart(chart, width="stretch")
        stages = _stages(url, backbone, task, scale, tuple(algorithms), modified)
        if len(stages):
            st.markdown("**Time per stage** (seconds per run, summed over steps, mean over runs)")
            bar = (alt.Chart(stages).mark_bar()
                   .encode(y=alt.Y("algorithm:N", title=None), x=alt.X("seconds_per_run:Q", title="seconds per run"),
                           color=alt.Color("stage:N"), tooltip=["algorithm", "stage", "seconds_per_run", "runs"])
                   .properties(height=max(160, 50 * stages["algorithm"].nunique())))
            st.altair_chart(bar, width="stretch")

    with tab_stab:
        st.subheader(f"Stability — {backbone}, {scale} scale")
        stab_tasks = tasks or choices["tasks"]
        stab_task = st.selectbox("Task", stab_tasks, key="stability_task")
        threshold = st.slider("Collapse: a fall from the running peak reward of more than", 0.05, 1.0, 0.2, 0.05,
                              key="collapse_drop")
        bands = _seed_bands(url, backbone, stab_task, scale, modified)
        if algorithms:
            bands = bands[bands["algorithm"].isin(algorithms)]
        if bands.empty:
            st.info(f"No reward curves for {backbone} × {stab_task} at {scale} scale.")
        else:
            st.caption("Mean reward over seeds per step, band = ± 1 standard deviation over seeds.")
            base = alt.Chart(bands).encode(x=alt.X("step:Q", title="step"), color=alt.Color("algorithm:N"))
            chart = (base.mark_area(opacity=0.2).encode(y=alt.Y("low:Q", title="reward"), y2="high:Q")
                     + base.mark_line().encode(y="mean:Q", tooltip=["algorithm", "step", "mean", "runs"]))
            st.altair_chart(chart.properties(height=280), width="stretch")
        collapses = _collapses(url, backbone, stab_task, scale, threshold, modified)
        st.markdown(f"**Reward collapses** (drop > {threshold:g}): {len(collapses)} run(s)")
        if len(collapses):
            st.dataframe(collapses, width="stretch", hide_index=True)
        st.markdown("**MC-sample sensitivity** (the ELBO methods' final score against their MC count)")
        mc = _mc(url, backbone, stab_task, scale)
        if algorithms:
            mc = mc[mc["algorithm"].isin(algorithms)]
        if mc.empty:
            st.info(f"No algorithm has runs at two or more MC counts for {backbone} × {stab_task} at {scale} scale. "
                    f"Sweep one: `dare-bench sweep bgpo-{backbone}-{stab_task} --scale {scale} "
                    f"--set train.mc_samples=8` (SPG: `--set train.algorithm.num_t=4 --set train.mc_samples=4`).")
        else:
            st.caption("Mean final score over seeds, bars = 95 % CI, per count of masks drawn per sequence (SPG: "
                       "num_t); the pinned runs and the runs whose overrides touch only "
                       f"{' / '.join(f'`{k}`' for k in data.MC_KNOBS)} (whatever the modified-runs switch says).")
            mc = mc.assign(low=mc["mean"] - mc["ci95"].fillna(0.0), high=mc["mean"] + mc["ci95"].fillna(0.0),
                           series=[f"{a} @ {b[:8]}" if b else a for a, b in zip(mc["algorithm"], mc["base"])])
            base = alt.Chart(mc).encode(x=alt.X("mc_samples:Q", title="MC samples", scale=alt.Scale(type="log",
                                                                                                   base=2)),
                                        color=alt.Color("series:N", title="algorithm"))
            chart = (base.mark_line(point=True).encode(y=alt.Y("mean:Q", title="final score"),
                                                       tooltip=["algorithm", "mc_samples", "mean", "ci95", "n",
                                                                "pinned"])
                     + base.mark_errorbar().encode(y=alt.Y("low:Q", title="final score"), y2="high:Q"))
            st.altair_chart(chart.properties(height=260), width="stretch")
            st.dataframe(mc.drop(columns=["low", "high", "series"]), width="stretch", hide_index=True)

    with tab_tpf:
        st.subheader(f"Speed vs quality — {backbone}, {scale} scale")
        points = _tpf(url, backbone, scale, modified)
        if points.empty:
            st.info(f"No final evaluations of {backbone} at {scale} scale with tokens per forward.")
        else:
            st.caption("Every final evaluation: its score against tokens per forward (decoded tokens / model "
                       "forwards), the hardware-independent speed axis of d3LLM's AUP leaderboard.")
            chart = (alt.Chart(points).mark_point(filled=True)
                     .encode(x=alt.X("tokens_per_forward:Q", title="tokens per forward"),
                             y=alt.Y("value:Q", title="score"), color="algorithm:N", shape="task:N",
                             tooltip=["run_id", "algorithm", "task", "metric", "value", "tokens_per_forward"]))
            st.altair_chart(chart.properties(height=300), width="stretch")

    with tab_run:
        st.subheader("Run drill-down")
        runs = _runs(url, backbone, task, scale, tuple(algorithms), modified)
        if runs.empty:
            st.info(f"No finished runs of {backbone} × {task} at {scale} scale.")
            return
        st.caption(f"The newest {len(runs)} runs of {backbone} × {task} at {scale} scale.")
        st.dataframe(runs, width="stretch", hide_index=True)
        labels = {int(r.run_id): f"#{r.run_id} {r.algorithm} seed {r.seed}" for r in runs.itertuples()}
        run_id = st.selectbox("Run", list(labels), format_func=labels.get, key="run_id")
        detail = _detail(url, int(run_id))
        if detail is None:
            st.warning(f"Run {run_id} is gone from the database.")
            return
        run = detail["run"]
        left, right = st.columns(2)
        with left:
            st.markdown("**Run record**")
            record = {k: run[k] for k in ("id", "uid", "reproduction", "algorithm", "backbone", "task", "scale",
                                          "seed", "status", "modified", "overrides", "config_hash", "code_version",
                                          "host", "origin", "started_at", "duration_s")}
            st.json(record)
            st.markdown("**Hardware**")
            st.json(run["hardware"], expanded=False)
            st.markdown("**Packages**")
            st.json(run["packages"], expanded=False)
        with right:
            st.markdown("**Resolved config**")
            st.json(run["config"], expanded=1)
        evs = detail["evaluations"]
        if not evs:
            st.info("This run has no evaluations.")
            return
        st.markdown("**Evaluations**")
        st.dataframe(pd.DataFrame([{k: e[k] for k in ("id", "checkpoint", "step", "task", "split", "primary_metric",
                                                      "primary_value", "n_items", "sampler_preset",
                                                      "data_fingerprint")} for e in evs]),
                     width="stretch", hide_index=True)
        ev_labels = {int(e["id"]): f"{e['checkpoint'] or 'eval'} · {e['task']} · {e['primary_metric']} = "
                                   f"{e['primary_value']:.3f}" for e in evs}
        finals = [i for i, e in zip(ev_labels, evs) if e["checkpoint"] == "final"]
        ev_id = st.selectbox("Evaluation", list(ev_labels), format_func=ev_labels.get, key="evaluation_id",
                             index=list(ev_labels).index(finals[-1]) if finals else 0)
        ev = next(e for e in evs if int(e["id"]) == ev_id)
        with st.expander("Sampler settings and metrics"):
            st.json({"sampler_preset": ev["sampler_preset"], "sampler": ev["sampler"], "metrics": ev["metrics"],
                     "data_fingerprint": ev["data_fingerprint"]})
        only = st.radio("Samples", ["all", "correct", "wrong"], horizontal=True, key="samples_only")
        _, total = _samples(url, ev_id, 0, only)
        pages = max(1, -(-total // data.SAMPLE_PAGE))
        page = st.number_input(f"Page (of {pages}, {data.SAMPLE_PAGE} per page)", min_value=1, max_value=pages,
                               value=1, step=1, key="samples_page") - 1
        samples, total = _samples(url, ev_id, int(page), only)
        st.caption(f"{total} samples ({only}); showing {len(samples)}.")
        if len(samples):
            st.dataframe(samples[["idx", "verdict", "score", "prompt", "completion", "reference", "item_id"]],
                         width="stretch", hide_index=True)


if __name__ == "__main__":
    main()

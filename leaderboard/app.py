"""dare-bench leaderboard, Streamlit entry point (the app itself ships in the package: dare_bench/leaderboard/app.py).

What it does: a read-only view of the results store: winners per backbone (algorithm × task, mean ± 95 % CI over
seeds, runs per cell), reported vs reproduced scores with sources, training curves and a run drill-down.

    dare-bench leaderboard --db results.db --port 8501                     # the usual way (headless, 127.0.0.1)
    DARE_BENCH_DB=sqlite:///results.db streamlit run leaderboard/app.py    # from a checkout, by hand

CPU only; no GPU or torchrun involved.
"""

from dare_bench.leaderboard.app import main

main()

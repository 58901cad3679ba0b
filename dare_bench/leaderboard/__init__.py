"""The leaderboard: a read-only Streamlit app over the results store (`app.py`), its SQL queries (`data.py`, no
Streamlit there, so every query is unit-testable) and the `dare-bench leaderboard` command (`commands.py`).

    dare-bench leaderboard --db results.db --port 8501                     # the usual way (headless, 127.0.0.1)
    DARE_BENCH_DB=sqlite:///results.db streamlit run leaderboard/app.py    # from a checkout, by hand

    from dare_bench.leaderboard.data import open_reader, winners
"""

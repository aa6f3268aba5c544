"""Load sweeps: every service of a host at several concurrency levels, judged per level against the profile's
[slo] table, with goodput, gates on the curve and the crossover of a speculative service with its plain twin
(docs/perf.md, *Sweeps, SLOs and the crossover*).

    curve.py     the data model (SweepCurve …): sweep.json, what the pictures are drawn from
    plan.py      [perf] sweep / sweep_requests / sweep_budget, [slo]: what to run and judge
    build.py     a LoadResult -> a LevelPoint (bounds, goodput, SLO outcome); speed-ups; curve_from_runs
    run.py       the interleaved sweep of a host, with its budget and early stop
    gates.py     max_concurrency_within_slo, goodput_at, the crossover
"""

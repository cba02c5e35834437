"""Analysis: from finished runs to tables, verdicts and plots; nothing here trains.

`evidence` holds the statistics (paired t-intervals, verdicts); `evidence_spec` an
experiment's configuration as the reports read it (methods, claims, tuning); `raw_metrics`
the compressed per-run metrics a report regenerates from; `run_groups` groups runs over
seeds and summarises them, `tables` and `curves` show the summaries, `report` puts them into
a results.md; `evidence_report` gives a configured experiment's verdicts, `family_report`
several experiments side by side, `benchmark_report` the benchmark's cells (with
`benchmark_contrasts`, the leader and full participation against the others, and
`benchmark_time`, time to target in a timed cell), `benchmark_heatmap` its picture and
`benchmark_page` the page; `plotting` draws
and writes PNGs, `fedgs_tables` FedGS's loss and selection-count tables. It is the library's
top layer: it may import everything below it (comparisons, program, runtime), and nothing in
the library imports it; the binaries do.
"""

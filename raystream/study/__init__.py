"""raystream.study: the analysis of finished sweeps, read back from MLflow (`raystream report`). Above tune in the
layers: it reads what tracking recorded and imports no Ray.

    report.py      `raystream report --experiment/--parent`: a sweep's paper-style table, its files and plots
    table.py       the report's table: trials grouped into rows, mean ± std over seeds, as Markdown and CSV
    plots.py       the report's figures: each metric against each numeric axis, the gradient-cosine figures, save
    matched.py     each metric at matched drift, for a sweep over optimizer.lr (matched.md / .csv / plots)
    stream_map.py  `raystream report --map`: Orthogonal-AdamW's lead at matched drift against each stream's correlation
    stats.py       the statistics: mean and std (numpy), Spearman's rho with its exact permutation p-value (scipy)
Markdown tables are written by raystream/markdown_table.py.
"""

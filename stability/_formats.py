"""The report and plot formats a stability report can be written in.

Their own module, free of pandas and plotting, so the click commands
(`stability._cli`) can name them as option defaults without importing the
report writer (`stability._export`) until a report is written.
"""

FORMATS = ("html", "md", "csv", "json", "tex")
PLOT_FORMATS = ("png", "svg")

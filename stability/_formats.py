"""The report and plot formats a stability report can be written in, the default margin
past which a seed counts as gone wrong, and the default bound on a study run in rounds.

Their own module, free of pandas and plotting, so the click commands
(`stability._cli`) can name them as option defaults without importing the
report writer (`stability._export`) or the statistics until a report is written.
"""

FORMATS = ("html", "md", "csv", "json", "tex")
PLOT_FORMATS = ("png", "svg")
# A seed "went wrong" when it is worse than its study's median by more than this share of the
# median's size (an accuracy under 0.9 x median, a loss over 1.1 x median), unless a threshold is given.
FAIL_MARGIN = 0.10
# `--until` and `--until-decided` stop at this many seeds per configuration if still undecided.
MAX_SEEDS_UNTIL = 256

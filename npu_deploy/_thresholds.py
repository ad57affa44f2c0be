"""The one FormatTrans threshold, in percent (design: flag format conversions above 8 % of device
compute time). Every judge reads it from here: the planner's estimate, the cost model, ``profile
analyze``, ``inspect`` and ``convert``'s verdicts."""

FORMATTRANS_THRESHOLD_PCT = 8.0

"""npu_deploy.profiling: profiler output in, FormatTrans findings out.

``discover`` finds what msprof / torch_npu / MindSpore wrote and picks one source per capture;
``parse`` streams its rows (header aliases, msprof's quirks, skipped rows counted); ``analyze`` computes
the shares of device compute time, the conversions responsible, round trips and suggestions into a
``ProfileReport``; ``report`` renders it as terminal text, JSON or one self-contained HTML file; ``run``
profiles a model first (msprof on an Ascend host, the emulator's estimated profile elsewhere).

>>> from npu_deploy import analyze_profile
>>> report = analyze_profile("PROF_000001_20230628101435646_FKFLNPEPPRRCFCBA")   # doctest: +SKIP
>>> report.verdict()                                                            # doctest: +SKIP
'FormatTrans 16.0 % of device compute (threshold 8 %): FLAGGED'
"""

"""Small profiler files written by the tests, so each quirk and scenario is a visible, named case.

Headers are the documented ones (``reference/msprof.md`` §3): the current msprof op_summary header and
the torch_npu kernel_details header. Rows are given as dicts of canonical fields and written with the
``csv`` module, so shapes like ``"32,3,224,224"`` (with their literal quotes) come out as msprof writes
them: the cell text gets three double quotes on each side.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

OP_SUMMARY_HEADER = ["Device_id", "Model ID", "Task ID", "Stream ID", "Op Name", "OP Type", "OP State",
                     "Task Type", "Task Start Time(us)", "Task Duration(us)", "Task Wait Time(us)",
                     "Block Num", "Mix Block Num", "HF32 Eligible", "Input Shapes", "Input Data Types",
                     "Input Formats", "Output Shapes", "Output Data Types", "Output Formats", "Context ID",
                     "aicore_time(us)", "aic_total_cycles"]
KERNEL_DETAILS_HEADER = ["Step Id", "Model ID", "Task ID", "Stream ID", "Name", "Type", "Accelerator Core",
                         "Start Time(us)", "Duration(us)", "Wait Time(us)", "Block Dim", "Mix Block Dim",
                         "HF32 Eligible", "Input Shapes", "Input Data Types", "Input Formats", "Output Shapes",
                         "Output Data Types", "Output Formats", "Context ID", "aicore_time(us)", "aic_total_cycles"]

# canonical field -> column in each header
_OP_SUMMARY_COL = {"device": "Device_id", "stream": "Stream ID", "name": "Op Name", "type": "OP Type",
                   "core": "Task Type", "start": "Task Start Time(us)", "dur": "Task Duration(us)",
                   "in_shape": "Input Shapes", "in_dtype": "Input Data Types", "in_fmt": "Input Formats",
                   "out_shape": "Output Shapes", "out_dtype": "Output Data Types", "out_fmt": "Output Formats"}
_KERNEL_COL = {"stream": "Stream ID", "name": "Name", "type": "Type", "core": "Accelerator Core",
               "start": "Start Time(us)", "dur": "Duration(us)", "in_shape": "Input Shapes",
               "in_dtype": "Input Data Types", "in_fmt": "Input Formats", "out_shape": "Output Shapes",
               "out_dtype": "Output Data Types", "out_fmt": "Output Formats"}


def op(name, type_, core, dur, *, in_shape="N/A", in_dtype="N/A", in_fmt="N/A", out_shape="N/A",
       out_dtype="N/A", out_fmt="N/A", stream="2", device="0"):
    """One task row as a dict of canonical fields. Shapes are given without quotes; they get msprof's."""
    q = (lambda s: s if s in ("N/A", "") else f'"{s}"')
    return {"name": name, "type": type_, "core": core, "dur": dur, "in_shape": q(in_shape), "in_dtype": in_dtype,
            "in_fmt": in_fmt, "out_shape": q(out_shape), "out_dtype": out_dtype, "out_fmt": out_fmt,
            "stream": stream, "device": device}


def td(name, src, dst, in_shape, out_shape, dur, **kw):
    return op(name, "TransData", "AI_VECTOR_CORE", dur, in_shape=in_shape, in_dtype="FLOAT16", in_fmt=src,
              out_shape=out_shape, out_dtype="FLOAT16", out_fmt=dst, **kw)


def csv_text(rows, *, style="op_summary", newline="\n", start=1736408883704643.212, quote_tab=True) -> str:
    """The CSV text of ``rows`` under the documented header of ``style`` (op_summary | kernel_details)."""
    header = OP_SUMMARY_HEADER if style.startswith("op_summary") else KERNEL_DETAILS_HEADER
    if style == "op_summary_device":  # device_N/summary files have no Device_id column
        header = header[1:]
    cols = _OP_SUMMARY_COL if style.startswith("op_summary") else _KERNEL_COL
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator=newline)
    w.writerow(header)
    t = start
    for i, r in enumerate(rows):
        cells = {h: "N/A" for h in header}
        cells.update({"Model ID": "4294967295", "Task ID": str(1000 + i), "Step Id": "1", "Block Num": "8",
                      "Block Dim": "8", "Mix Block Num": "0", "Mix Block Dim": "0", "HF32 Eligible": "NO",
                      "Task Wait Time(us)": "0", "Wait Time(us)": "0", "OP State": "static",
                      "aicore_time(us)": "0", "aic_total_cycles": "0"})
        for key, col in cols.items():
            if col not in cells:
                continue
            if key == "start":
                # the trailing TAB msprof writes (Excel guard); its Python path also quotes the cell
                cells[col] = f"\x01{t:.3f}\t\x01" if quote_tab else f"{t:.3f}\t"
            elif key in r:
                cells[col] = str(r[key])
        dur = r.get("dur")
        try:
            t += float(dur) + 1.0
        except (TypeError, ValueError):
            t += 1.0
        w.writerow([cells[h] for h in header])
    return buf.getvalue().replace("\x01", '"')


def write_csv(path: Path, rows, *, style="op_summary", newline="\n", bom=False, encoding="utf-8") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = csv_text(rows, style=style, newline=newline)
    data = text.encode(encoding)
    if bom:
        data = b"\xef\xbb\xbf" + data
    path.write_bytes(data)
    return path


def flagged_rows():
    """A flagged inference step, computed by hand: device compute 1000 µs of which TransData 160 µs
    (16.0 %), Transpose 10 µs (1.0 %), Cast 10 µs (1.0 %), AI CPU 30 µs (3.0 %); a 5000 µs all-reduce
    that must not enter the denominator (with it TransData would be 160/6000 = 2.7 %).

    Round trips: NC1HWC0→NCHW→NC1HWC0 on [1,64,56,56] around a Relu between two convolutions (30 µs),
    and FRACTAL_NZ→ND→FRACTAL_NZ on [128,384] around an Add between MatMuls, twice (2 × 50 µs).
    """
    return [
        td("trans_TransData_0", "NCHW", "NC1HWC0", "1,3,224,224", "1,1,224,224,16", "30.000"),
        op("Conv_0/Conv2D", "Conv2D", "AI_CORE", "100.000", in_fmt="NC1HWC0;FRACTAL_Z", out_fmt="NC1HWC0"),
        td("trans_TransData_1", "NC1HWC0", "NCHW", "1,4,56,56,16", "1,64,56,56", "15.000"),
        op("Relu_1", "Relu", "AI_VECTOR_CORE", "10.000", in_fmt="NCHW", out_fmt="NCHW"),
        td("trans_TransData_2", "NCHW", "NC1HWC0", "1,64,56,56", "1,4,56,56,16", "15.000"),
        op("Conv_2/Conv2D", "Conv2D", "AI_CORE", "100.000", in_fmt="NC1HWC0;FRACTAL_Z", out_fmt="NC1HWC0"),
        op("MatMul_3", "MatMulV2", "AI_CORE", "150.000", in_fmt="FRACTAL_NZ;FRACTAL_NZ", out_fmt="FRACTAL_NZ"),
        td("trans_TransData_3", "FRACTAL_NZ", "ND", "24,8,16,16", "128,384", "25.000"),
        op("Add_4", "Add", "AI_VECTOR_CORE", "20.000", in_fmt="ND;ND", out_fmt="ND"),
        td("trans_TransData_4", "ND", "FRACTAL_NZ", "128,384", "24,8,16,16", "25.000"),
        op("MatMul_5", "MatMulV2", "AI_CORE", "150.000", in_fmt="FRACTAL_NZ;FRACTAL_NZ", out_fmt="FRACTAL_NZ"),
        td("trans_TransData_5", "FRACTAL_NZ", "ND", "24,8,16,16", "128,384", "25.000"),
        op("Add_6", "Add", "AI_VECTOR_CORE", "20.000", in_fmt="ND;ND", out_fmt="ND"),
        td("trans_TransData_6", "ND", "FRACTAL_NZ", "128,384", "24,8,16,16", "25.000"),
        op("MatMul_7", "MatMulV2", "AI_CORE", "150.000", in_fmt="FRACTAL_NZ;FRACTAL_NZ", out_fmt="FRACTAL_NZ"),
        op("hcom_allReduce__1_0", "hcom_allReduce_", "COMMUNICATION", "5000.000", stream="N/A"),
        op("Transpose_8", "Transpose", "AI_VECTOR_CORE", "10.000", in_shape="128,12,32;3", in_fmt="ND;ND",
           out_shape="12,128,32", out_fmt="ND", in_dtype="FLOAT16;INT64", out_dtype="FLOAT16"),
        op("Cast_9", "Cast", "AI_VECTOR_CORE", "10.000", in_shape="128,384", in_dtype="FLOAT", in_fmt="ND",
           out_shape="128,384", out_dtype="FLOAT16", out_fmt="ND"),
        op("Gather_10", "GatherV2", "AI_CPU", "30.000", in_shape="30522,384;128;1",
           in_dtype="FLOAT16;INT64;INT64", in_fmt="ND;ND;ND", out_shape="128,384", out_dtype="FLOAT16",
           out_fmt="ND"),
        op("LayerNorm_11", "LayerNormV3", "AI_VECTOR_CORE", "90.000"),
    ]

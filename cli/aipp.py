"""``npu-deploy aipp``: write an AIPP config from the values users think in, or check one.

    npu-deploy aipp --input-format RGB888_U8 --size 224x224 --mean 123.675,116.28,103.53 \\
        --std 58.395,57.12,57.375 -o aipp.cfg
    npu-deploy aipp --check aipp.cfg
"""

from __future__ import annotations

import click

from npu_deploy._text import printable
from npu_deploy.errors import InputError


def _floats(text: str | None, option: str) -> list[float] | None:
    if not text:
        return None
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise InputError(f"{option} {text!r} is not a comma-separated list of numbers") from None


def _ints(text: str | None, option: str, n: int) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = text.replace("x", ",").split(",")
    try:
        vals = tuple(int(p) for p in parts)
    except ValueError:
        vals = ()
    if len(vals) != n or any(v < 0 for v in vals):
        raise InputError(f"{option} {text!r}: expected {n} non-negative integers")
    return vals


@click.command("aipp", context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--check", "check_path", type=click.Path(dir_okay=False), default=None,
              help="Check an existing AIPP config (exit 0 valid, 2 invalid).")
@click.option("--input-format", default="RGB888_U8", show_default=True, help="RGB888_U8, YUV420SP_U8 or YUV400_U8.")
@click.option("--size", default=None, metavar="WxH", help="The model input's width x height.")
@click.option("--mean", default=None, metavar="M0,M1,M2", help="Per-channel mean in pixel units.")
@click.option("--std", default=None, metavar="S0,S1,S2", help="Per-channel standard deviation in pixel units.")
@click.option("--crop", default=None, metavar="X,Y,W,H", help="Crop of the source image (W,H equal --size).")
@click.option("--src-size", default=None, metavar="WxH", help="Source image size (default: crop end or --size).")
@click.option("--swap", is_flag=True, help="Swap R and B (U and V for YUV).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="Write the config here.")
def command(check_path, input_format, size, mean, std, crop, src_size, swap, output):
    """Write or check an AIPP config (ATC's --insert_op_conf; also the built-in lowering's)."""
    from npu_deploy.converters.lowering import aipp

    if check_path:
        configs = aipp.parse_config(check_path)
        for c in configs:
            w, h = c.result_size()
            click.echo(printable(f"aipp_op (input rank {c.related_input_rank}): {c.aipp_mode} {c.input_format}, "
                                 f"source {c.src_image_size_w}x{c.src_image_size_h}, result {w}x{h}"))
        click.echo(printable(f"{check_path}: valid ({len(configs)} aipp_op block{'s' if len(configs) != 1 else ''})"))
        return
    if not size or not output:
        raise click.UsageError("give --size WxH and -o FILE (or --check FILE)")
    cfg = aipp.from_flags(input_format=input_format, size=_ints(size, "--size", 2), mean=_floats(mean, "--mean"),
                          std=_floats(std, "--std"), crop=_ints(crop, "--crop", 4),
                          src_size=_ints(src_size, "--src-size", 2), swap=swap, path=output)
    aipp.write_config(output, [cfg])
    click.echo(printable(f"AIPP config written: {output}"))

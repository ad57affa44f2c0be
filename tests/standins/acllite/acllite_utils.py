"""Stand-in of acllite's ``acllite_utils.py``: ``check_ret`` raises ``Exception("<api> failed ret_int=<n>")``."""

import constants as const  # noqa: F401  (flat import, as the real acllite does)


def check_ret(message, ret_int):
    if ret_int != 0:
        raise Exception("{} failed ret_int={}".format(message, ret_int))

"""The built-in key/value cache policies (contract: "Key/value caches" in
``minitensor/core/hookspecs.py``). Registered exactly as a user's policy would be."""

import minitensor as mt


@mt.hookimpl
def minitensor_kv_caches():
    return {}

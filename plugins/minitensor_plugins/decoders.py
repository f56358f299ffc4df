"""The built-in decoders: processors of next-token scores and searches (contract: "Decoders" in
``minitensor/core/hookspecs.py``). Registered exactly as a user's decoder would be."""

import minitensor as mt


@mt.hookimpl
def minitensor_decoders():
    return {}

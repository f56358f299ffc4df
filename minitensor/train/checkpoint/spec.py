"""The checkpoint format's fixed parts, which every other file of the package shares: the names
of its files and its version, the caps on what a checkpoint can make a loader read and build,
and the errors. The format field by field is described in __init__.py and checked in fields.py.
"""

FORMAT = "minitensor-checkpoint"
FORMAT_VERSION = 1
CHECKPOINT_JSON = "checkpoint.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
_OWN_FILES = (CHECKPOINT_JSON, MODEL_FILE, OPTIMIZER_FILE)
_TENSOR = "__tensor__"  # marks an array in the optimiser's JSON index
_NDARRAY = "__ndarray__"  # marks an array inside a generator state (MT19937's key, Philox's counter)

# What a checkpoint may make a loader read and build. checkpoint.json holds the vocabularies
# and the training history: a 1,000,000-word vocabulary is about 12 MB of JSON. Parsing JSON
# builds at most ~25 bytes of Python objects per byte of text (a list of empty lists), so
# 16 MiB bounds that at about 400 MB. A safetensors header is capped the same way.
MAX_JSON_BYTES = 16 * 2**20
# A safetensors file: 4 GiB, a billion float32 numbers, far beyond what a NumPy model trains.
# With a model (or optimiser) given, its arrays must also have the model's shapes, which bounds
# the file by the model's own size before anything but the header is read.
MAX_TENSOR_FILE_BYTES = 2**32
MAX_TENSORS = 100_000  # arrays in a state_dict, parameters in an optimiser
MAX_VOCAB_SIZE = 2**20  # tokens in one vocabulary
MAX_TOKEN_CHARS = 1000
MAX_TEXT_CHARS = 1000  # class names, keys, plugin names and sources, file paths
MAX_ENTRIES = 1000  # plugins, vocabularies, devices, parameter groups, settings, list lengths
MAX_DEPTH = 64  # levels of nesting in any field (config and extra included)
MAX_INT = 2**63 - 1  # step, epoch, counters, parameter indices


class CheckpointError(RuntimeError):
    """A checkpoint cannot be saved or loaded: missing or damaged files, another model's
    weights, a plugin that is not installed... Loading that fails changes nothing."""


class _FieldError(CheckpointError):
    """A field of checkpoint.json that is missing, of the wrong type or out of range. The
    message names the field by its path; the caller adds which checkpoint it is in."""

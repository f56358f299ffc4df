"""Training: the loop and pictures of what was learned. (Decoding lives in ``minitensor.inference``;
its names stay importable from here too.)"""

from ..inference import Hypothesis, beam_search, generate, greedy, sample, step_attention, translate  # noqa: F401
from .checkpoint import (
    CheckpointError,
    find_checkpoint,
    get_rng_state,
    load_checkpoint,  # noqa: F401
    save_checkpoint,
    set_rng_state,
)
from .config import TrainConfig, build_data, build_model  # noqa: F401
from .loop import TrainingError, TrainResult, evaluate, train  # noqa: F401
from .plots import (
    plot_cross_attention,
    plot_decoder_self_attention,
    plot_encoder_attention,  # noqa: F401
    plot_loss,
    plot_seq2seq_attention,
    plot_transformer_attention,
    show_heatmaps,
    stack_decoding_steps,
)

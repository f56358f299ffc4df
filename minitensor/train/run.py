"""A run folder: where one training run keeps its checkpoints and figures, owned by one process.

    runs/date/
        checkpoint/            the latest state, what ``--resume`` continues from
        best/                  the weights with the lowest held-out loss so far: what
                               ``translate`` and ``generate`` load from a run folder
        loss.png, attention_*.png     the figures of the finished run
        tokenizer.json         a BPE run's tokenizer (--tokenizer bpe), trained on its text
        .lock                  held while a process trains here (the owner's pid inside)

Three rules keep a learner's runs from being lost:

1. A new run refuses a folder that already holds one (``RunExistsError``): continue it
   (``resume=True``, ``--resume``), delete that run's files and start afresh
   (``overwrite=True``, ``--overwrite``: only the files listed above; anything else in the
   folder stays), or train somewhere else (``--out``).
2. One process per folder: the lock is taken before anything else and held to the end, so a
   second trainer fails at once (``RunBusyError``) instead of crashing mid-run when the two
   swap checkpoints under each other. The lock is an OS lock (``fcntl.flock``), which the
   kernel releases when its process dies, however it dies; the pid in the file is only there
   to name the owner, and to notice a lock file that a killed run left behind.
3. Nothing in a run refers to the working directory: the folder is wherever ``--out`` says
   now, so a run copied with ``cp -a`` resumes in (and writes to) the copy.

An unusable folder (a file, not writable) is refused here, before any data is generated.

What a run saved is read back through ``load_run_checkpoint``: the checkpoint's own checks
(``checkpoint/``), then the run's config and the loop's extras, field by field, and whether
the config fits the saved weights -- all before a model is built.
"""

import datetime
import errno
import math
import os
import shlex
import shutil
import socket
import warnings

from .checkpoint import CheckpointError, find_checkpoint, load_checkpoint
from .config import MAX_SIZE, TOKENIZER_FILE, TrainConfig, is_finite_number, is_integer, min_num_parameters

try:  # the lock of a run folder: fcntl on POSIX, msvcrt on Windows
    import fcntl
except ImportError:
    import msvcrt

    fcntl = None

CHECKPOINT_DIR = "checkpoint"
BEST_DIR = "best"
LOCK_FILE = ".lock"
# the files a run writes into its folder (besides the two checkpoint folders); translate's
# heatmaps are the user's and stay
FIGURES = (
    "loss.png",
    "attention.png",
    "attention_encoder_self.png",
    "attention_decoder_self.png",
    "attention_cross.png",
)


class RunFolderError(ValueError):
    """``--out`` cannot hold this run: not a folder, not writable, or (subclasses) another run."""


class RunExistsError(RunFolderError):
    """A new run was asked for in a folder that already holds one."""


class RunBusyError(RunFolderError):
    """Another process is training in this folder."""


def run_files(folder):
    """The files and folders of a run in ``folder`` (those ``overwrite`` would delete)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return []
    own = {CHECKPOINT_DIR, BEST_DIR, TOKENIZER_FILE, *FIGURES}
    # ".checkpoint.old-*" / ".checkpoint.tmp-*": what an interrupted save left (train.checkpoint)
    leftovers = tuple(f".{name}.{tag}-" for name in (CHECKPOINT_DIR, BEST_DIR) for tag in ("old", "tmp"))
    return sorted(e for e in entries if e in own or e.startswith(leftovers))


def holds_run(folder):
    """Whether ``folder`` holds a run's checkpoint (or what an interrupted save left of one);
    figures and a BPE run's tokenizer, written before its first checkpoint, are not one."""
    return any(not f.endswith(".png") and f != TOKENIZER_FILE for f in run_files(folder))


def has_checkpoint(folder):
    """Whether ``folder`` holds a checkpoint/ to resume from (or the backup an interrupted save
    left of one, which ``find_checkpoint`` recovers)."""
    try:
        find_checkpoint(folder, CHECKPOINT_DIR)
    except CheckpointError:
        return False
    return True


def nothing_to_resume(folder):
    """The error for ``--resume`` of a folder that holds no run, or a run with no checkpoint."""
    if holds_run(folder):  # e.g. best/ alone: the disk filled up while the first checkpoint/ was saved
        return unfinished_run(folder)
    return RunFolderError(
        f"{folder} holds no run to resume (no {CHECKPOINT_DIR}/ in it); start one with: "
        f"minitensor train --out {shlex.quote(os.fspath(folder))}"
    )


def unfinished_run(folder):
    """The error for a folder holding a run's files but no checkpoint/: a run that stopped
    before its first checkpoint was saved. There is nothing to resume, so --resume is not
    offered; the user deletes those files or trains elsewhere."""
    files = run_files(folder)
    shown = ", ".join(files[:4]) + (", ..." if len(files) > 4 else "")
    return RunExistsError(
        f"{folder} holds an unfinished run with no {CHECKPOINT_DIR}/ ({shown}): it stopped before its first "
        "checkpoint was saved, so there is nothing to resume; delete it and start afresh with --overwrite, "
        "or choose another --out"
    )


def describe_run(folder):
    """A few words on the run in ``folder``, for messages: "a checkpoint at step 628 (epoch 4)"."""
    try:
        info = load_checkpoint(find_checkpoint(folder, CHECKPOINT_DIR), restore_rng=False, read_arrays=False)
    except (CheckpointError, ValueError, OSError):
        files = run_files(folder)
        return f"files of a run ({', '.join(files[:4])}{', ...' if len(files) > 4 else ''})"
    return f"a checkpoint at step {info['step']} (epoch {info['epoch']})"


# -- reading what a run saved -------------------------------------------------------------------
def check_weights_fit(config, info, where):
    """Refuse a checkpoint whose config describes a model much larger than its weights,
    *before* ``build_model`` allocates it (an edited config must not fill the memory)."""
    vocabs = info["vocabs"]
    if "src" not in vocabs or "tgt" not in vocabs:
        raise CheckpointError(
            f"{where}: the checkpoint holds no 'src' and 'tgt' vocabularies; it was not written by minitensor train"
        )
    saved = sum(math.prod(shape) for shape in info["shapes"].values())
    needed = min_num_parameters(config, len(vocabs["src"]), len(vocabs["tgt"]))
    if needed > saved:
        raise CheckpointError(
            f"{where}: its config describes a model of at least {needed:,} parameters, but the "
            f"saved weights hold {saved:,}: the config does not belong to these weights"
        )


def _check_extra(extra, where):
    """The training loop's own fields of a checkpoint ("extra"), checked before use: a
    ``CheckpointError`` naming the field, never a KeyError or a huge allocation later."""

    def fail(name, what, value):
        raise CheckpointError(f'{where}: field "extra.{name}" must be {what}, got {value!r:.60}')

    if not isinstance(extra, dict):
        fail("", "a dict", extra)
    for name in ("num_steps", "tgt_num_steps"):
        value = extra.get(name)
        if not is_integer(value) or not 1 <= value <= MAX_SIZE:
            fail(name, f"an integer from 1 to {MAX_SIZE:,}", value)
    if "history" in extra or "batches" in extra:  # a run's latest checkpoint (not best/)
        batches, history = extra.get("batches"), extra.get("history")
        if not isinstance(batches, dict):
            fail("batches", "a dict", batches)
        for name in ("seed", "epoch", "position"):
            value = batches.get(name)
            if not is_integer(value) or not 0 <= value < 2**63:
                fail(f"batches.{name}", "a non-negative integer", value)
        if not isinstance(history, dict):
            fail("history", "a dict", history)
        losses = history.get("loss")
        if not isinstance(losses, list) or not all(is_finite_number(v) for v in losses):
            fail("history.loss", "a list of finite numbers", losses)
        evals = history.get("eval")
        if not isinstance(evals, list) or not all(
            isinstance(e, dict) and all(is_finite_number(v) for v in e.values()) for e in evals
        ):
            fail("history.eval", "a list of dicts of numbers", evals)
        value = history.get("steps_per_epoch")
        if not is_integer(value) or value < 1:
            fail("history.steps_per_epoch", "a positive integer", value)
    if "heldout_loss" in extra and not is_finite_number(extra["heldout_loss"]):
        fail("heldout_loss", "a finite number", extra["heldout_loss"])


def load_run_checkpoint(directory):
    """(TrainConfig, the ``load_checkpoint`` dict) of a checkpoint ``minitensor train`` wrote,
    with its config and extras checked (``ConfigError`` / ``CheckpointError`` naming the field)
    and the weights checked to fit the config: what ``translate``, ``generate`` and
    ``--resume`` read before they build a model."""
    info = load_checkpoint(directory, restore_rng=False, read_arrays=False)  # the JSON and the tensors' shapes
    where = f"checkpoint {directory}"
    if info["config"] is None:
        raise CheckpointError(f"{where}: it holds no training config; cannot rebuild its model")
    config = TrainConfig.from_dict(info["config"], f"{where}: config")
    _check_extra(info["extra"], where)
    check_weights_fit(config, info, where)
    return config, info


# -- the folder ------------------------------------------------------------------------------------
class RunFolder:
    """The run folder ``path``, prepared and locked for one run (a context manager)::

        with RunFolder("runs/date", resume=False, overwrite=False) as run:
            ...  # train; save into run.checkpoint / run.best

    ``__enter__`` refuses an unusable folder (``RunFolderError``), takes the lock
    (``RunBusyError`` if another process holds it), then checks the folder against the
    request: a new run needs a folder without a run (``RunExistsError``) unless
    ``overwrite``, which deletes that run's files; ``resume`` needs one. ``__exit__``
    releases the lock.
    """

    def __init__(self, path, *, resume=False, overwrite=False):
        self.path = os.path.abspath(os.fspath(path))
        self.resume, self.overwrite = resume, overwrite
        self.checkpoint = os.path.join(self.path, CHECKPOINT_DIR)
        self.best = os.path.join(self.path, BEST_DIR)
        self.display = os.fspath(path)  # as the user wrote it, for messages
        self._fd, self._made = None, False

    def command(self, *flags):
        """The ``minitensor train`` command line for this folder, quoted for a shell."""
        return " ".join(["minitensor train --out", shlex.quote(self.display), *flags])

    def best_loss(self):
        """The held-out loss recorded in best/, or inf when there is none."""
        try:
            _, info = load_run_checkpoint(find_checkpoint(self.path, BEST_DIR))
        except CheckpointError:
            return math.inf
        return info["extra"].get("heldout_loss", math.inf)

    def __enter__(self):
        self._made = self._make_folder()
        self._lock()
        try:
            self._check_contents()
        except BaseException:
            self.__exit__(RunFolderError)  # (__exit__ is not called when __enter__ raises)
            raise
        return self

    def __exit__(self, error_type, *_):
        self._unlock()
        if error_type is not None and self._made:
            try:  # a run that failed before writing anything leaves no empty folder behind
                os.rmdir(self.path)
            except OSError:
                pass
        return False

    # -- the folder -------------------------------------------------------------------------------
    def _make_folder(self):
        """Create the folder if need be; True if it was created here."""
        if os.path.lexists(self.path) and not os.path.isdir(self.path):
            raise RunFolderError(f"--out {self.display} is a file, not a folder; choose a folder for the run")
        if os.path.isdir(self.path):
            return False
        try:
            os.makedirs(self.path)
        except OSError as e:
            raise RunFolderError(f"cannot create the run folder --out {self.display}: {e.strerror}") from e
        return True

    def _check_contents(self):
        if self.resume:
            if not has_checkpoint(self.path):
                raise nothing_to_resume(self.display)
            return
        if not run_files(self.path):
            return
        if self.overwrite:
            self._delete_run_files()
            return
        if not has_checkpoint(self.path):
            raise unfinished_run(self.display)
        raise RunExistsError(
            f"{self.display} already holds a run ({describe_run(self.path)}); continue it with --resume, "
            f"delete it and start afresh with --overwrite, or choose another --out"
        )

    def _delete_run_files(self):
        for name in run_files(self.path):
            target = os.path.join(self.path, name)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.remove(target)

    # -- the lock ---------------------------------------------------------------------------------
    def _lock(self):
        lock_path = os.path.join(self.path, LOCK_FILE)
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise RunFolderError(f"cannot write to the run folder --out {self.display}: {e.strerror}") from e
            if not _try_lock(fd):
                owner = _read_owner(fd)
                os.close(fd)
                raise RunBusyError(
                    f"{self.display} is in use by another training run ({owner}); wait for it to "
                    f"finish or choose another --out"
                )
            # A finishing owner deletes the lock file: make sure we locked the file that is
            # still there, not one just unlinked (else two processes could both "own" it).
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        left = _read_owner(fd, raw=True)
        if left:
            warnings.warn(
                f"{self.display}: took over the lock left by {left}, which ended without releasing it "
                f"(killed?); its last saved checkpoint is intact",
                RuntimeWarning,
                stacklevel=3,
            )
        started = datetime.datetime.now().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"process {os.getpid()} on {socket.gethostname()}, started {started}\n".encode())
        self._fd = fd

    def _unlock(self):
        if self._fd is None:
            return
        try:
            # unlink before closing: whoever opens the path next creates a new file (see _lock)
            os.unlink(os.path.join(self.path, LOCK_FILE))
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None


def _try_lock(fd):
    """Lock ``fd`` exclusively without waiting; False if another process holds it."""
    if fcntl is None:  # Windows
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


def _read_owner(fd, raw=False):
    """Who the lock file says holds it: "process 123 on host, started ..." (at most a line)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 200).decode("utf-8", "replace").strip().splitlines()
    except OSError:
        text = []
    line = text[0] if text else ""
    if raw:
        return line
    return line or "its owner is starting up"

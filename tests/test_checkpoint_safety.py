"""Checkpoint safety (minitensor/train/checkpoint/): a crafted or damaged checkpoint is one
CheckpointError line, costs bounded memory and changes nothing; a save killed at any instant
leaves a run folder that loads, and the next save cleans up after it.

The mutation matrix walks a real checkpoint.json, so a field added to the format is mutated
too. Each field is given a value of the wrong type, removed, made huge and made negative, and
the content hash is recomputed each time, as a crafted file's would be: the field checks, not
the hash, must catch it. Each case must raise CheckpointError in one line naming the field,
leave every file of the checkpoint byte-identical and the model, optimiser, scheduler and
random generators as they were -- or load, for the few mutations that are valid (listed in
VALID, with the reason).
"""

import hashlib
import json
import math
import os
import subprocess
import sys
import tracemalloc
import warnings
from pathlib import Path

import kill_at
import numpy as np
import pytest

import minitensor as mt
from minitensor import nn
from minitensor.data import Vocab
from minitensor.train import checkpoint as ckpt
from minitensor.train.checkpoint import (
    CheckpointError,
    find_checkpoint,
    get_rng_state,
    load_checkpoint,
    save_checkpoint,
)
from minitensor.train.checkpoint import save as ckpt_save

V = 7


def make_lm(seed):
    mt.manual_seed(seed)
    return nn.TransformerLM(V, 8, 16, 2, 1, 0.1, max_len=16)


def make_training(model):
    opt = mt.optim.Adam(model.parameters(), lr=1.0)
    return opt, mt.optim.NoamLR(opt, d_model=8, warmup_steps=3)


def snapshot(model):
    return {k: v.numpy() for k, v in model.state_dict().items()}


def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def folder_hashes(path):
    """Every entry of ``path`` and its SHA-256 (entries that are not regular files by kind)."""
    out = {}
    for entry in sorted(os.listdir(path)):
        full = os.path.join(path, entry)
        out[entry] = hashlib.sha256(Path(full).read_bytes()).hexdigest() if os.path.isfile(full) else "not a file"
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A checkpoint with every part: a trained TransformerLM, Adam's state, a NoamLR schedule,
    two vocabularies, config, extra. Returns (path, its checkpoint.json text, the weights)."""
    model = make_lm(1)
    opt, sched = make_training(model)
    loss = mt.cross_entropy(model(mt.tensor([[1, 2, 3]])), mt.tensor([[2, 3, 4]]))
    loss.backward()
    opt.step()
    sched.step()
    path = save_checkpoint(
        tmp_path_factory.mktemp("safety") / "checkpoint",
        model,
        opt,
        sched,
        config={"num_hiddens": 8},
        vocabs={"src": Vocab(list("ab")), "tgt": Vocab(list("xy"))},
        extra={"note": "kept"},
        step=1,
        epoch=0,
    )
    return path, Path(path, "checkpoint.json").read_text(), snapshot(model)


# -- the mutation matrix ------------------------------------------------------------------------
def children(value, path):
    """The fields inside ``value``: a list's first item stands for all of them, and so does the
    first parameter's entry of optimizer.state."""
    if isinstance(value, dict):
        items = list(value.items())
        return items[:1] if path == ("optimizer", "state") else items
    if isinstance(value, list):
        return [(0, value[0])] if value else []
    return []


def fields(value, path=()):
    """Every field path of checkpoint.json, walked from the file itself. "config" and "extra"
    are the caller's (TrainConfig, the training loop) and are tested there."""
    for key, child in children(value, path):
        if path + (key,) in (("config",), ("extra",)):
            continue
        yield path + (key,)
        yield from fields(child, path + (key,))


def dotted(path):
    out = ""
    for key in path:
        out += f"[{key}]" if isinstance(key, int) else (f".{key}" if out else key)
    return out


def mutated(value, kind):
    """``value`` made wrong in one way, or None when that way does not apply to it."""
    if kind == "wrong type":
        for types, other in ((bool, "yes"), (str, 5), (int, "5"), (float, "0.5"), (list, {"0": 1}), (dict, [1])):
            if isinstance(value, types):
                return other
        return 5  # null
    if kind == "huge":
        if isinstance(value, bool) or value is None:
            return None
        if isinstance(value, int):
            return 10**30
        if isinstance(value, float):
            return math.inf
        if isinstance(value, str):
            return "x" * 10**5  # above every cap on a string (a 10 MB one: see the bounded-memory test)
        if isinstance(value, list):
            return [0] * (max(CAPS.values()) + 1)  # above every cap on a list's length
        return {**value, **{f"x{i}": 0 for i in range(ckpt.MAX_ENTRIES + 1)}}
    if kind == "negative" and type(value) in (int, float):
        return -5 if isinstance(value, int) else -1.5
    return None


# Mutations that give a valid checkpoint; everything else must be refused.
VALID = {
    # PCG64's state and increment are 128-bit numbers: 10**30 is one
    *((f"rng.{g}.state.{k}", "huge") for g in ("host", "backends.cpu", "backends.strict") for k in ("state", "inc")),
    # a device missing from rng.backends is one the saving process did not have: skipped
    ("rng.backends.cpu", "missing"),
    ("rng.backends.strict", "missing"),
    # vocabs is {name: vocab}: which vocabularies a program needs is its own business
    ("vocabs.src", "missing"),
    ("vocabs.tgt", "missing"),
    # a scheduler's setting, not the optimiser's: the optimiser keeps its own
    ("optimizer.param_groups[0].initial_lr", "missing"),
}
# The field a refusal names when it is judged together with others (an array the state does
# not refer to is a difference between optimizer.state and optimizer.safetensors).
NAMED = {("optimizer.state.0", "missing"): "optimizer.state"}


def write_mutation(path, text, field, kind):
    """checkpoint.json with ``field`` mutated and the content hash recomputed (when the field is
    not the hash itself); False if ``kind`` does not apply to that field."""
    body = json.loads(text)
    claimed = body.pop("content_sha256")
    target = body if field[0] != "content_sha256" else {"content_sha256": claimed}
    *parents, last = field
    for key in parents:
        target = target[key]
    if kind == "missing":
        if not isinstance(target, dict):
            return False
        del target[last]
    else:
        value = mutated(target[last], kind)
        if value is None:
            return False
        target[last] = value
    if field[0] == "content_sha256":
        body.update(target)
    else:
        body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    Path(path, "checkpoint.json").write_text(json.dumps(body))
    return True


def rng_json():
    return json.dumps(get_rng_state(), sort_keys=True)


# The caps on a list's length, lowered for the matrix: a list one longer than the real
# MAX_VOCAB_SIZE costs a second to write and parse, and is refused by the same line of code.
CAPS = {"MAX_TENSORS": 2000, "MAX_VOCAB_SIZE": 2000, "MAX_ENTRIES": ckpt.MAX_ENTRIES}


@pytest.mark.parametrize("kind", ["wrong type", "missing", "huge", "negative"])
def test_every_field_of_checkpoint_json_is_checked(saved, kind, monkeypatch):
    for name, cap in CAPS.items():
        monkeypatch.setattr(ckpt.fields, name, cap)  # where the schema reads its caps
    path, text, weights = saved
    problems, cases = [], 0
    try:
        for field in fields(json.loads(text)):
            if not write_mutation(path, text, field, kind):
                continue
            cases += 1
            name = dotted(field)
            model = make_lm(9)
            opt, sched = make_training(model)
            before_model, before_rng, before_disk = snapshot(model), rng_json(), folder_hashes(path)
            try:
                load_checkpoint(path, model, opt, sched)
            except CheckpointError as e:
                message, named = str(e), NAMED.get((name, kind), name)
                if (name, kind) in VALID:
                    problems.append(f"{name} {kind}: refused, but valid: {message[:200]}")
                elif "\n" in message or not any(f'"{named}{end}' in message for end in '".['):
                    problems.append(f"{name} {kind}: the message does not name the field in one line: {message[:300]}")
                if (
                    not same(snapshot(model), before_model)
                    or opt.state
                    or sched.last_epoch != 0
                    or rng_json() != before_rng
                ):
                    problems.append(f"{name} {kind}: a failed load changed the model, optimiser, scheduler or RNG")
            except Exception as e:  # noqa: BLE001  (any other exception is the failure being tested)
                problems.append(f"{name} {kind}: {type(e).__name__}: {str(e)[:200]}")
            else:
                if (name, kind) not in VALID:
                    problems.append(f"{name} {kind}: loaded")
                elif not same(snapshot(model), weights):
                    problems.append(f"{name} {kind}: loaded other weights")
            if folder_hashes(path) != before_disk:
                problems.append(f"{name} {kind}: the checkpoint on disk changed")
    finally:
        Path(path, "checkpoint.json").write_text(text)
    assert cases >= {"wrong type": 80, "missing": 70, "huge": 80, "negative": 25}[kind]  # 272 in all now
    assert not problems, "\n".join(problems)


def test_the_walk_reaches_every_part_of_the_format(saved):
    """The matrix walks the file: every top-level field of the format is in it (the caller's
    config and extra aside), so a field added to the writer is mutated without a test edit."""
    walked = {f[0] for f in fields(json.loads(saved[1]))}
    assert walked == set(ckpt._BODY_FIELDS + ("content_sha256",)) - {"config", "extra"}
    assert ("optimizer", "param_groups", 0, "betas", 0) in set(fields(json.loads(saved[1])))


@pytest.mark.parametrize(
    "field, value",
    [
        ("created", "yesterday"),
        ("minitensor_version", "9.9.9"),
        ("model.device", "cuda"),
        ("step", None),
        ("epoch", None),
        ("step", 2**63 - 1),
        ("config", None),
        ("extra", None),
        ("config", {"anything": [1, "x"]}),
        ("plugins[0].version", None),
        ("vocabs.src.idx_to_token[4]", "\n"),
        ("rng.backends.cuda", {"seed": 3, "draws": 0}),
        ("rng.backends.tpu", None),
        ("optimizer.param_groups[0].lr", 0),
        ("scheduler.state.factor", 2),
    ],
)
def test_valid_values_load(saved, field, value):
    path, text, weights = saved
    body = json.loads(text)
    body.pop("content_sha256")
    target = body
    parts = [int(p) if p.isdigit() else p for p in field.replace("[", ".").replace("]", "").split(".")]
    for key in parts[:-1]:
        target = target[key]
    target[parts[-1]] = value
    body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    Path(path, "checkpoint.json").write_text(json.dumps(body))
    try:
        model = make_lm(9)
        info = load_checkpoint(path, model, *make_training(model))
    finally:
        Path(path, "checkpoint.json").write_text(text)
    assert same(snapshot(model), weights)
    if field in ("step", "epoch", "config", "extra"):
        assert info[field] == value


@pytest.mark.parametrize(
    "edit, named",
    [
        (lambda b: b.update(config=[1]), '"config" must be a JSON object or null'),
        (lambda b: b.update(extra="x"), '"extra" must be a JSON object or null'),
        (lambda b: b.update(config={"a": json.loads("[" * 70 + "]" * 70)}), '"config" nests more than 64 levels'),
        (
            lambda b: b["vocabs"]["src"].update(reserved_tokens=["<unk>"]),
            '"vocabs.src.reserved_tokens" must be the first',
        ),
        (lambda b: b["vocabs"]["src"]["idx_to_token"].append("a"), '"vocabs.src.idx_to_token[6]" repeats'),
        (lambda b: b["vocabs"]["src"]["idx_to_token"].append("\ud800"), '"vocabs.src.idx_to_token[6]" must be text'),
        (lambda b: b["model"].update(num_parameters=b["model"]["num_parameters"] + 1), '"model.num_parameters" is'),
        (lambda b: b["model"]["keys"].pop(), '"model.keys" does not match the arrays in model.safetensors'),
        (
            lambda b: b["optimizer"]["param_groups"][0].update(betas=[0.9, 1.0]),
            '"optimizer.param_groups[0]" does not suit this Adam: Adam: betas',
        ),
        (
            lambda b: b["optimizer"]["state"].pop(str(b["optimizer"]["param_groups"][0]["params"].pop())),
            '"optimizer.param_groups[0].params" lists 14 parameter(s), this Adam\'s group 0 has 15',
        ),
        (
            lambda b: b["optimizer"]["param_groups"][0]["params"].pop(),
            '"optimizer.state.14" must be the index of a parameter that "optimizer.param_groups" lists',
        ),
        (
            lambda b: b["optimizer"]["param_groups"].append({"params": [99], "lr": 0.1}),
            '"optimizer.param_groups" has 2',
        ),
        (lambda b: b["optimizer"]["state"].update({"99": {}}), '"optimizer.state.99" must be the index of a parameter'),
        (
            lambda b: b["scheduler"]["state"].update(last_epoch=[1]),
            '"scheduler.state.last_epoch" must be a number, as in',
        ),
        (lambda b: b["scheduler"]["state"].pop("d_model"), '"scheduler.state.d_model" is missing'),
        (lambda b: b["rng"]["host"]["state"].update(state=2**128), '"rng.host.state.state" must be at most'),
        (
            lambda b: b["rng"]["host"].update(bit_generator="MT19937"),
            '"rng.host.has_uint32" is not part of a MT19937 state',
        ),
        (lambda b: b["rng"]["host"].pop("has_uint32"), '"rng.host.has_uint32" is missing'),
        (
            lambda b: b["vocabs"]["src"]["idx_to_token"].append("x" * 10**7),
            '"vocabs.src.idx_to_token[6]" must be a string of at most 1,000 characters',
        ),
        (
            lambda b: b["files"].update({"../../etc/passwd": b["files"]["model.safetensors"]}),
            "\"files['../../etc/passwd']\" is not part of the checkpoint format",
        ),
    ],
)
def test_what_only_a_whole_view_catches_is_refused_by_name(saved, edit, named):
    """Consistency between fields, and with the model, the optimiser and the files."""
    path, text, _ = saved
    body = json.loads(text)
    body.pop("content_sha256")
    edit(body)
    body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    Path(path, "checkpoint.json").write_text(json.dumps(body))
    try:
        model = make_lm(9)
        params = snapshot(model)
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path, model, *make_training(model))
    finally:
        Path(path, "checkpoint.json").write_text(text)
    assert named in str(e.value) and "\n" not in str(e.value)
    assert same(snapshot(model), params)


# -- files that are not what they claim: refused at once, in bounded memory ------------------------
def bytes_read():
    """Bytes this process has read through read() and its kin so far (Linux's /proc/self/io
    ``rchar``), or None where there is no such count."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration):
        return None


def peak_memory(call):
    """(the exception ``call`` raised, peak bytes allocated meanwhile, bytes read meanwhile or
    None): a count, not a time, so the bound holds on a loaded machine too."""
    tracemalloc.start()
    before = bytes_read()
    try:
        call()
    except CheckpointError as e:
        error = e
    else:
        error = None
    after = bytes_read()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return error, peak, None if before is None or after is None else after - before


def sparse_model_file(path, model, size):
    """model.safetensors as a sparse file of ``size`` bytes (no disk space) whose header lists the
    model's arrays with their shapes, but for the first, which fills the rest of the file: a
    header that fits the record. The record says what was written; the hash is left wrong (it is
    checked only after the header)."""
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    header, offset = {}, 0
    for key, shape in list(shapes.items())[1:]:
        n = 4 * math.prod(shape)
        header[key] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    n = len(json.dumps(header)) + 256  # room for the first entry
    first, rest = next(iter(shapes)), size - 8 - n - offset
    header[first] = {"dtype": "U8", "shape": [rest], "data_offsets": [offset, offset + rest]}
    text = json.dumps(header).encode().ljust(n)
    with open(Path(path, "model.safetensors"), "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text)
        f.truncate(size)
    body = json.loads(Path(path, "checkpoint.json").read_text())
    body.pop("content_sha256")
    body["files"]["model.safetensors"] = {"sha256": "0" * 64, "bytes": size}
    body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    Path(path, "checkpoint.json").write_text(json.dumps(body))
    return f"{first!r}: checkpoint shape ({rest},), model shape {tuple(shapes[first])}"


@pytest.mark.parametrize(
    "swap",
    [
        "symlink to /dev/zero",
        "symlink to a copy",
        "FIFO",
        "directory",
        "recorded 10**12 bytes",
        "2 GiB sparse file",
        "huge checkpoint.json",
        "checkpoint.json symlink to /dev/zero",
    ],
)
def test_files_that_are_not_what_they_claim_are_refused_quickly_in_bounded_memory(tmp_path, swap):
    model = make_lm(1)
    path = Path(save_checkpoint(tmp_path / "checkpoint", model))
    file = path / "model.safetensors"
    if swap.startswith("symlink"):
        target = "/dev/zero" if "zero" in swap else tmp_path / "copy"
        if target != "/dev/zero":
            target.write_bytes(file.read_bytes())
        file.unlink()
        file.symlink_to(target)
        message = "is a symbolic link; a checkpoint holds only regular files"
    elif swap == "FIFO":
        file.unlink()
        os.mkfifo(file)
        message = "is a FIFO (named pipe)"
    elif swap == "directory":
        file.unlink()
        file.mkdir()
        message = "is a directory"
    elif swap == "recorded 10**12 bytes":
        body = json.loads((path / "checkpoint.json").read_text())
        body.pop("content_sha256")
        body["files"]["model.safetensors"]["bytes"] = 10**12
        body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
        (path / "checkpoint.json").write_text(json.dumps(body))
        message = 'field "files.model.safetensors.bytes" must be at most 4,294,967,296, got 1000000000000'
    elif swap == "2 GiB sparse file":  # a header that fits the record: the model's shapes refuse it
        message = sparse_model_file(path, model, 2**31)
    elif swap == "huge checkpoint.json":
        with open(path / "checkpoint.json", "r+b") as f:
            f.truncate(ckpt.MAX_JSON_BYTES + 1)
        message = f"is {ckpt.MAX_JSON_BYTES + 1:,} bytes, more than the {ckpt.MAX_JSON_BYTES:,}"
    else:
        (path / "checkpoint.json").unlink()
        (path / "checkpoint.json").symlink_to("/dev/zero")
        message = "checkpoint.json is a symbolic link"
    before = sorted(os.listdir(path))
    target = make_lm(5)
    params = snapshot(target)
    error, peak, read = peak_memory(lambda: load_checkpoint(path, target))
    assert error is not None and message in str(error), error
    # < 4 MiB held and read: nothing the size of the file (2 GiB), not even streamed through a hash
    assert peak < 2**22 and (read is None or read < 2**22), (peak, read)
    assert sorted(os.listdir(path)) == before and same(snapshot(target), params)


def test_read_arrays_false_reads_the_json_and_the_header_alone(tmp_path):
    """What a program needs to build the model (config, vocabs, the arrays' shapes) without
    reading arrays that no model bounds yet: only the sparse file's header is read."""
    model = make_lm(1)
    path = Path(save_checkpoint(tmp_path / "checkpoint", model, config={"n": 8}))
    info = load_checkpoint(path, read_arrays=False)
    assert info["state_dict"] is None and info["shapes"] == {k: v.shape for k, v in model.state_dict().items()}
    sparse_model_file(path, model, 2**31)
    tracemalloc.start()
    info = load_checkpoint(path, read_arrays=False, restore_rng=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert info["config"] == {"n": 8} and peak < 2**22
    assert sum(math.prod(shape) for shape in info["shapes"].values()) > 2**30  # for the caller to judge
    with pytest.raises(ValueError, match="read_arrays=False"):
        load_checkpoint(path, make_lm(1), read_arrays=False)


# -- the missing-plugin hint: checkpoint text is never a command unless it is a valid name ----------
@pytest.mark.parametrize(
    "source, distribution, expected, absent",
    [
        ("good-dist 1.2", "good-dist", "from good-dist 1.2 is not installed: pip install good-dist;", None),
        ("x 1", "x; rm -rf ~", "from 'x 1' (", "pip install"),
        ("x 1", "-e git+https://evil", "from 'x 1' (", "pip install"),
        (
            "file /home/me/my scorer.py",
            None,
            "plugin file '/home/me/my scorer.py' when saved: pass --plugin '/home/me/my scorer.py' (or set "
            "MINITENSOR_PLUGINS='/home/me/my scorer.py')",
            None,
        ),
        ("file relative/$(rm).py", None, "from 'file relative/$(rm).py' (", "--plugin relative"),
        (
            "module my_pkg.scorers",
            None,
            "pass --plugin my_pkg.scorers (or set MINITENSOR_PLUGINS=my_pkg.scorers)",
            None,
        ),
        ("module my_pkg;rm -rf", None, "from 'module my_pkg;rm -rf' (", "--plugin my_pkg"),
    ],
)
def test_a_missing_plugin_hint_never_turns_checkpoint_text_into_a_command(
    saved, source, distribution, expected, absent
):
    path, text, _ = saved
    body = json.loads(text)
    body.pop("content_sha256")
    body["plugins"][0].update(name="absent_scorer", source=source, distribution=distribution, version="1.2")
    body["content_sha256"] = ckpt._sha256(ckpt._canonical(body))
    Path(path, "checkpoint.json").write_text(json.dumps(body))
    try:
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path, read_arrays=False, restore_rng=False)
    finally:
        Path(path, "checkpoint.json").write_text(text)
    line = str(e.value).splitlines()[1]
    assert line.startswith("  scorer 'absent_scorer' ") and expected in line, line
    assert absent is None or absent not in line
    assert "--plugin" in line  # every hint says how to load a plugin file or module


def test_plugin_files_and_modules_are_not_distributions():
    for source in ("file /a b/c.py", "module pkg.mod", "built-in", "registered at run time", "entry point x:y"):
        assert ckpt._split_source(source) == (None, None)
    assert ckpt._split_source("minitensor-example-cosine 0.1.0") == ("minitensor-example-cosine", "0.1.0")


# -- finding a run's checkpoint -------------------------------------------------------------------
def test_find_checkpoint_takes_a_run_folder_or_a_checkpoint_and_says_what_is_missing(tmp_path):
    run = tmp_path / "run"
    path = save_checkpoint(run / "checkpoint", make_lm(1))
    assert find_checkpoint(run) == path and find_checkpoint(path) == path
    (run / "other").mkdir()
    (run / "other" / ".checkpoint.tmp-123").mkdir()
    with pytest.raises(
        CheckpointError,
        match=r"no checkpoint in .*other: it holds neither checkpoint.json \(a "
        r"checkpoint\) nor checkpoint/ .*only .checkpoint.tmp-123, a save that "
        "never completed",
    ):
        find_checkpoint(run / "other")
    (run / "file").write_text("x")
    with pytest.raises(CheckpointError, match="is not a directory"):
        find_checkpoint(run / "file")
    with pytest.raises(CheckpointError, match="no checkpoint at .*nowhere: it does not exist"):
        find_checkpoint(tmp_path / "nowhere")


# -- saves killed at every step -------------------------------------------------------------------
SAVE = """
import sys
sys.path.insert(0, sys.argv[3])
import kill_at
kill_at.install(sys.argv[4])
import minitensor as mt
from minitensor.train.checkpoint import save_checkpoint
mt.manual_seed(int(sys.argv[2]))
save_checkpoint(sys.argv[1], mt.nn.Linear(3, 2), step=int(sys.argv[2]))
"""


def linear(seed):
    mt.manual_seed(seed)
    return mt.nn.Linear(3, 2)


def killed_save(path, step, seed):
    done = subprocess.run(
        [sys.executable, "-c", SAVE, str(path), str(seed), kill_at.TESTS, step],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -9, (done.returncode, done.stderr[-2000:])


def leftovers(run):
    return sorted(e for e in os.listdir(run) if e.startswith(".checkpoint."))


def loads_as(run, seed):
    """Load through the run folder as the CLI does; the checkpoint must be the one saved from
    ``seed``, complete; and loading must not change the folder."""
    before = {e: folder_hashes(run / e) for e in os.listdir(run)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "a save was interrupted": expected after the first rename
        info = load_checkpoint(find_checkpoint(run), linear(99))
    assert info["step"] == seed
    assert same({k: v.numpy() for k, v in info["state_dict"].items()}, snapshot(linear(seed)))
    assert {e: folder_hashes(run / e) for e in os.listdir(run)} == before
    return info


# Which checkpoint a run folder holds after a save is killed at each step: the old one until
# the new one is renamed into place. A step added to SAVE_STEPS fails here until it is listed.
SURVIVOR = {
    "after-tmp-files": "old",
    "after-fsync": "old",
    "after-first-rename": "old",
    "after-second-rename": "new",
    "before-cleanup": "new",
}


@pytest.mark.parametrize("step", ckpt.SAVE_STEPS)
def test_a_save_killed_at_any_step_leaves_a_loadable_run(tmp_path, step):
    survivor = SURVIVOR[step]
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoint", linear(1), step=1)
    killed_save(run / "checkpoint", step, seed=2)
    assert leftovers(run)  # the kill left something to clean up
    info = loads_as(run, 1 if survivor == "old" else 2)
    assert bool(info["recovered_from"]) == (step == "after-first-rename")
    save_checkpoint(run / "checkpoint", linear(3), step=3)
    assert leftovers(run) == []
    loads_as(run, 3)


def test_a_save_killed_while_recovering_from_a_kill_loses_nothing(tmp_path):
    """Killed between the renames twice in a row: the second save first renames the backup back,
    so the checkpoint read is still the last complete one."""
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoint", linear(1), step=1)
    killed_save(run / "checkpoint", "after-first-rename", seed=2)
    killed_save(run / "checkpoint", "after-first-rename", seed=3)
    assert len([e for e in leftovers(run) if ".old-" in e]) == 1
    loads_as(run, 1)
    save_checkpoint(run / "checkpoint", linear(4), step=4)
    assert leftovers(run) == []
    loads_as(run, 4)


def test_a_misspelt_kill_step_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match="'after-frist-rename' is not a save step; it must be one of after-tmp-files, "
    ):
        kill_at.install("after-frist-rename")


def test_a_save_passes_every_named_instant_in_order(tmp_path, monkeypatch):
    """The seam the kills use: ``reached`` is called at each of SAVE_STEPS, in order (the first
    rename only when a checkpoint is replaced), and does nothing by default."""
    seen = []
    monkeypatch.setattr(ckpt_save, "reached", seen.append)
    save_checkpoint(tmp_path / "checkpoint", linear(1))
    assert seen == [s for s in ckpt.SAVE_STEPS if s != "after-first-rename"]
    seen.clear()
    save_checkpoint(tmp_path / "checkpoint", linear(2))
    assert seen == list(ckpt.SAVE_STEPS)


def test_a_save_deletes_stale_leftovers_and_refuses_what_could_not_be_loaded(tmp_path):
    run = tmp_path / "run"
    first = save_checkpoint(run / "checkpoint", linear(1), step=1)
    (run / ".checkpoint.tmp-abandoned").mkdir()
    (run / ".checkpoint.tmp-abandoned" / "model.safetensors").write_bytes(b"half")
    stale = run / ".checkpoint.old-superseded"
    stale.mkdir()
    for name in os.listdir(first):
        (stale / name).write_bytes(Path(first, name).read_bytes())
    save_checkpoint(run / "checkpoint", linear(2), step=2)
    assert leftovers(run) == []
    with pytest.raises(CheckpointError, match='field "step" must be a non-negative integer or null, got -1'):
        save_checkpoint(run / "checkpoint", linear(3), step=-1)
    with pytest.raises(CheckpointError, match='field "config" must be a JSON object or null'):
        save_checkpoint(run / "checkpoint", linear(3), config=[1])
    assert load_checkpoint(run / "checkpoint")["step"] == 2
    assert leftovers(run) == []

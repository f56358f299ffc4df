"""One self-contained HTML page of a model's attention and of the graph autograd walks.

``AttentionPage(capture, tokens, output)`` turns what ``mt.viz.capture`` recorded into a page:
for every attention layer and head, the scores before the pooling, the weights after it and
the positional bias (where a "scores" encoding gave one), with masked keys greyed out; a
cell's numbers on hover; each query's entropy and top keys; the autograd graph of one
attention call (``mt.viz.graph``); with a key/value cache policy other than ``full``, the
cache step by step (``cache=``: which tokens each block's cache holds at the step the reader
picks, the dropped ones struck through, its memory and the step's weights over what it kept);
every label in English or Chinese (the terms of ``tutorials/GLOSSARY.md``), the choice
remembered by the browser.

The page is one file and needs nothing else: the data travel as JSON inside it, the drawing
is ``page.js`` and the style ``page.css``, both inlined, and a Content-Security-Policy that
allows nothing but the page itself makes the browser refuse any request that would leave it.
Blocks and heads are numbered from 1, as in the PNG heatmaps.
"""

import html
import json
import math
import re
from importlib import resources

import numpy

from ..atomic import write_atomic

# Every label of the page, in both languages (terms as in tutorials/GLOSSARY.md).
LABELS = {
    "en": {
        "title": "Attention, step by step",
        "output": "Output, token by token",
        "alternatives": "Other hypotheses of the beam (score)",
        "attention": "Attention",
        "layer": "Layer",
        "head": "head",
        "block": "block",
        "view": "Show",
        "weights": "attention weights",
        "scores": "attention scores (before the pooling)",
        "bias": "positional bias",
        "encoder_self": "encoder self-attention",
        "decoder_self": "decoder self-attention",
        "cross": "encoder–decoder attention",
        "self": "self-attention",
        "query": "query",
        "key": "key",
        "score": "score",
        "masked": "masked (may not attend)",
        "entropy": "entropy",
        "top": "top keys",
        "queries": "Per query",
        "hover": "Hover a cell to see its query, key, score and weight.",
        "graph": "The autograd graph of one attention call",
        "graph_note": "One box per operation, numbered in the order backward visits them; "
        "shape, dtype, bytes saved for backward and, after backward, the gradient norm.",
        "language": "Language",
        "cache": "The key/value cache, step by step",
        "cache_note": "What decoding with this cache policy attended: at the chosen step, the tokens the block's "
        "cache holds (those it dropped struck through, the attention sinks it keeps apart from the recent "
        "tokens outlined) and the weights the step's query gave each head's kept keys.",
        "policy": "cache policy",
        "step": "decoding step",
        "in_cache": "in the cache",
        "dropped": "dropped from the cache",
        "sink": "attention sink",
        "not_seen": "in the cache, masked for this query",
        "memory": "cache memory",
        "full_memory": "a full cache would hold",
        "tokens_held": "tokens held",
        "all_blocks": "all blocks",
        "text_position": "position in the text",
        "cache_position": "position in the attention",
    },
    "zh": {
        "title": "逐步看注意力",
        "output": "输出（逐个词元）",
        "alternatives": "束搜索的其他假设（分数）",
        "attention": "注意力",
        "layer": "层",
        "head": "头",
        "block": "块",
        "view": "显示",
        "weights": "注意力权重",
        "scores": "注意力评分（汇聚之前）",
        "bias": "注意力偏置（位置）",
        "encoder_self": "编码器自注意力",
        "decoder_self": "解码器自注意力",
        "cross": "编码器－解码器注意力",
        "self": "自注意力",
        "query": "查询",
        "key": "键",
        "score": "评分",
        "masked": "已掩蔽（不可关注）",
        "entropy": "熵",
        "top": "权重最大的键",
        "queries": "每个查询",
        "hover": "将鼠标悬停在格子上，查看其查询、键、评分和权重。",
        "graph": "一次注意力计算的计算图",
        "graph_note": "每个方框是一个运算，编号是反向传播访问它们的顺序；"
        "形状、数据类型、为反向传播保存的字节数，以及反向传播之后的梯度范数。",
        "language": "语言",
        "cache": "键值缓存（逐个解码时间步）",
        "cache_note": "用这个缓存策略解码时实际关注的内容：所选解码时间步上，该块的键值缓存保留的词元"
        "（已移出的词元加删除线，与最近词元分开保留的注意力汇点加框），以及该步的查询给每个头保留的键的注意力权重。",
        "policy": "缓存策略",
        "step": "解码时间步",
        "in_cache": "在键值缓存中",
        "dropped": "已移出键值缓存",
        "sink": "注意力汇点（attention sink）",
        "not_seen": "在键值缓存中，但已掩蔽（此查询不可关注）",
        "memory": "键值缓存占用的内存",
        "full_memory": "完整缓存（full）需要",
        "tokens_held": "保留的词元",
        "all_blocks": "所有块",
        "text_position": "在文本中的位置",
        "cache_position": "在注意力中的位置",
    },
}

CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_BLOCK = re.compile(r"\.blks\.(\d+)\.")


def _kind(name):
    """Which attention a layer's dotted name is: cross, encoder or decoder self-attention."""
    if "attention2" in name or name.endswith("decoder.attention"):  # (the Bahdanau decoder's)
        return "cross"
    if name.startswith("encoder"):
        return "encoder_self"
    if name.startswith("decoder") and "attention1" in name:
        return "decoder_self"
    return "self"


def _rounded(array, digits=6):
    """A nested list for JSON, rounded; -inf and NaN become None (JSON has no infinities)."""
    rounded = numpy.round(numpy.asarray(array, dtype=numpy.float64), digits)
    if rounded.ndim == 1:
        return [float(v) if math.isfinite(v) else None for v in rounded]
    return [_rounded(part, digits) for part in rounded]


_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥"})


def _shown(tokens, token_label=str):
    """Tokens as labels: ``token_label(token)`` (a BPE token's text), its spaces and line breaks
    made visible (a character model's " " token, a BPE token's " the": ␣, ␣the)."""
    return [token_label(t).translate(_VISIBLE) for t in tokens]


def _stacked(records):
    """One record per layer: a layer called once per decoded token (queries of length 1 each,
    as a Bahdanau decoder is) has its calls stacked along the queries; otherwise the last call."""
    if len(records) == 1 or any(r.scores.shape[-2] != 1 for r in records):
        return records[-1]
    keys = records[0].scores.shape[-1]
    if any(r.scores.shape[-1] != keys for r in records):  # a growing cache: the last call sees every key
        return records[-1]

    def join(what):
        parts = [getattr(r, what) for r in records]
        if any(p is None for p in parts):
            return None
        return numpy.concatenate([numpy.broadcast_to(p, r.scores.shape) for p, r in zip(parts, records)], axis=-2)

    first = records[0]
    return type(first)(first.name, join("scores"), join("bias"), join("allowed"), join("weights"))


def _sinks(seen):
    """The kept tokens a query sees apart from its recent ones: those before the first gap in the
    text positions it attends (StreamingLLM's sinks once the tokens after them are dropped)."""
    gaps = numpy.flatnonzero(numpy.diff(seen) != 1)
    return [] if len(gaps) == 0 else seen[: gaps[0] + 1].tolist()


def _cache_data(recorded, token_label):
    """``explain.cache_steps``' records as the page carries them: tokens as labels, arrays as
    lists, weights rounded, each block's sinks marked."""
    steps = []
    for step in recorded["steps"]:
        blocks = []
        for block in step["blocks"]:
            kept = numpy.asarray(block["kept"], dtype=numpy.int64)
            attended = numpy.asarray(block["attended"], dtype=bool)
            weights = numpy.asarray(block["weights"])
            if weights.shape[-1] != len(kept) or len(attended) != len(kept):
                raise ValueError(
                    f"AttentionPage: the cache at step {step['query']} holds {len(kept)} tokens, but its weights "
                    f"cover {weights.shape[-1]} keys and its mask {len(attended)}"
                )
            blocks.append(
                {
                    "kept": kept.tolist(),
                    "positions": numpy.asarray(block["positions"], dtype=numpy.int64).tolist(),
                    "attended": attended.tolist(),
                    "sinks": _sinks(kept[attended]),
                    "weights": _rounded(weights.reshape(-1, len(kept))),
                    "bytes": int(block["bytes"]),
                    "full_bytes": int(block["full_bytes"]),
                }
            )
        steps.append({"query": int(step["query"]), "blocks": blocks})
    options = {str(k): v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in recorded["options"].items()}
    tokens = _shown(recorded["tokens"], token_label)
    return {
        "policy": recorded["policy"],
        "options": options,
        "tokens": tokens,
        "prompt": recorded["prompt"],
        "steps": steps,
    }


def _heads(array):
    """(batch 1, heads, Q, K) or (batch 1, Q, K) -> (heads, Q, K) of the first example."""
    array = numpy.asarray(array)
    return array[0] if array.ndim == 4 else array[:1] if array.ndim == 3 else array[None]


class AttentionPage:
    """The page (see the module docstring): ``html``, ``save(path)``, ``_repr_html_``.

    ``capture``: a ``mt.viz.Capture`` of ONE example (batch 1), or a list of its records;
    ``tokens``: {"encoder": source tokens, "decoder": decoder input tokens} (an LM: only
    "decoder"), labelling the queries and keys of each kind of layer; ``output``: the
    decoded tokens; ``alternatives``: other hypotheses as (tokens, score) pairs;
    ``graph``: a ``mt.viz.Graph`` to show; ``lang``: "en" or "zh", the first language shown;
    ``token_label``: the text a token shows as (default ``str``; a BPE model's symbols as text);
    ``cache``: the steps of a decoding with a cache policy, ``{"policy", "options", "tokens"
    (the prompt and its continuation), "prompt" (its length), "steps"}`` with the steps of
    ``mt.viz.explain.cache_steps``, or None (no cache section). ``page.cache`` holds them as the
    page carries them (lists, tokens as labels, each block's ``sinks``).
    """

    def __init__(
        self,
        capture,
        tokens,
        output=(),
        alternatives=(),
        graph=None,
        title=None,
        lang="en",
        token_label=str,
        cache=None,
    ):
        if lang not in LABELS:
            raise ValueError(f"AttentionPage: lang must be one of {sorted(LABELS)}, got {lang!r}")
        records = getattr(capture, "records", capture)
        self.lang, self.title = lang, title
        self.output, self.alternatives, self.graph = list(output), list(alternatives), graph
        self.token_label = token_label
        self.cache = None if cache is None else _cache_data(cache, token_label)
        self.layers = []
        calls = {}
        for record in records:
            calls.setdefault(record.name, []).append(record)
        for name, group in calls.items():
            record = _stacked(group)
            kind = _kind(name)
            queries = tokens.get("encoder" if kind == "encoder_self" else "decoder", [])
            keys = tokens.get("decoder" if kind in ("decoder_self", "self") else "encoder", [])
            weights = _heads(record.weights)
            if weights.shape[1:] != (len(queries), len(keys)):
                raise ValueError(
                    f"AttentionPage: layer {name!r} attends {weights.shape[1]} queries to {weights.shape[2]} keys, "
                    f"but {len(queries)} query and {len(keys)} key tokens were given"
                )
            queries, keys = _shown(queries, token_label), _shown(keys, token_label)
            block = _BLOCK.search(name)
            bias = None if record.bias is None else numpy.broadcast_to(record.bias, record.scores.shape)
            self.layers.append(
                {
                    "name": name,
                    "kind": kind,
                    "block": int(block.group(1)) + 1 if block else None,
                    "queries": queries,
                    "keys": keys,
                    "scores": _rounded(_heads(record.scores)),
                    "weights": _rounded(weights),
                    "bias": None if bias is None else _rounded(_heads(bias)),
                    "allowed": _heads(record.allowed).tolist(),
                }
            )

    @property
    def html(self):
        """The whole page as one HTML string: the data of every layer as JSON, the script and the
        style inlined, so that the file works offline and on its own (what ``save`` writes)."""
        data = {"lang": self.lang, "labels": LABELS, "layers": self.layers}
        if self.cache is not None:  # without one, the page's data are what they always were
            data["cache"] = self.cache
        assets = resources.files(__package__)
        script = assets.joinpath("page.js").read_text(encoding="utf-8")
        style = assets.joinpath("page.css").read_text(encoding="utf-8")
        labels = LABELS[self.lang]

        def label(key, tag="span", extra=""):
            return f'<{tag} data-label="{key}"{extra}>{html.escape(labels[key])}</{tag}>'

        tokens = "".join(f"<span>{html.escape(t)}</span>" for t in _shown(self.output, self.token_label))
        alternatives = ""
        if self.alternatives:
            items = "".join(
                f"<li>{html.escape(' '.join(_shown(toks, self.token_label)))} ({score:.3f})</li>"
                for toks, score in self.alternatives
            )
            alternatives = f"{label('alternatives', 'h3')}<ol>{items}</ol>"
        graph = ""
        if self.graph is not None:
            note = label("graph_note", "p", ' class="note"')
            graph = f'{label("graph", "h2")}{note}<div class="graph">{self.graph.svg}</div>'
        cache = ""
        if self.cache is not None:
            options = ", ".join(f"{k}={v}" for k, v in self.cache["options"].items())
            policy = html.escape(self.cache["policy"] + (f" ({options})" if options else ""))
            legend = "".join(
                f'<span class="{kind}" data-label="{kind}">{html.escape(labels[kind])}</span>'
                for kind in ("in_cache", "sink", "dropped", "not_seen")
            )
            cache = f"""{label("cache", "h2")}{label("cache_note", "p", ' class="note"')}
<div class="controls">{label("policy")} <code id="cache-policy">{policy}</code>
{label("step")} <select id="cache-step"></select> {label("block")} <select id="cache-block"></select></div>
<div class="tokens legend">{legend}</div>
<div id="cache-memory"></div>
<div class="tokens" id="cache-tokens"></div>
<div id="cache-heatmap-box"></div>
"""

        # </script> inside the JSON would end the script element: escape the slash
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
        return f"""<!DOCTYPE html>
<html lang="{"zh-CN" if self.lang == "zh" else "en"}" data-minitensor-page>
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(self.title or labels["title"])}</title>
<style>{style}</style>
</head>
<body>
<div class="controls">{label("language")} <select id="lang"><option value="en">English</option>\
<option value="zh">中文</option></select></div>
{label("title", "h1")}
{label("output", "h2")}<div class="tokens" id="output">{tokens}</div>{alternatives}
{label("attention", "h2")}
<div class="controls">{label("layer")} <select id="layer"></select> <select id="head"></select>
{label("view")} <select id="view"><option value="weights" data-label="weights">{labels["weights"]}</option>\
<option value="scores" data-label="scores">{labels["scores"]}</option>\
<option value="bias" id="view-bias" data-label="bias">{labels["bias"]}</option></select></div>
<div id="tooltip"></div>
<div id="heatmap-box"></div>
{label("queries", "h3")}<ul id="queries"></ul>
{cache}{graph}
<script type="application/json" id="page-data">{payload}</script>
<script>{script}</script>
</body>
</html>
"""

    def _repr_html_(self):
        return self.html

    def save(self, path):
        """Write the page to ``path`` (UTF-8; written beside it, then renamed: never half a page)."""
        return write_atomic(path, self.html)

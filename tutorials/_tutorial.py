"""What every tutorial shares: the smoke switch, the figure folder and deliberate mistakes.

A tutorial runs in two sizes:

- full (the default): the sizes and epochs the prose talks about, minutes on a laptop CPU;
- smoke (``MINITENSOR_TUTORIAL_SMOKE=1``): everything shrunk so that the test suite can run
  every tutorial in seconds. The claims a tutorial asserts must hold at both sizes.

Figures go to ``MINITENSOR_TUTORIAL_OUT`` (default ``tutorial_figures/`` in the current
folder), one subfolder per tutorial.

Every tutorial exists in two languages: English here, Chinese in ``zh/`` (same file names, the
same code, translated prose and comments). ``LANG`` says which one is running, and figure
titles and labels go through ``text``, which looks the Chinese ones up in ``LABELS``. Chinese
labels need a font with CJK glyphs, which matplotlib does not ship: the library's
``minitensor.i18n.cjk_font`` finds one on the system (Noto Sans CJK, WenQuanYi, Source Han Sans,
...), else in the ``mplfonts`` package (``pip install "minitensor[zh]"``), else the figures keep
English labels and one warning says so. The library's own figures (``plot_loss``, the attention
maps, ``mt.viz.graph``) take the tutorial's language too: ``lang=LANG``.

Some cells make a mistake on purpose, to show the error minitensor gives for it; they run
under ``expect_error``, which labels the mistake and its error in the printed output so that
a reader never takes them for the tutorial breaking.
"""

import os
import pathlib

from minitensor.i18n import LABELS as LIBRARY_LABELS  # the labels of the library's own figures
from minitensor.i18n import font_for  # and the font search they use

SMOKE = os.environ.get("MINITENSOR_TUTORIAL_SMOKE", "") not in ("", "0")

# ``zh/_tutorial.py`` runs this file's code with its own ``__file__``: the folder names the language.
LANG = "zh" if pathlib.Path(__file__).resolve().parent.name == "zh" else "en"


def pick(full, smoke):
    """``full`` normally, ``smoke`` in smoke mode: ``epochs = pick(200, 5)``."""
    return smoke if SMOKE else full


def figure_path(tutorial, name):
    """Where a tutorial's figure goes: ``<out>/<tutorial>/<name>`` (folders created)."""
    folder = pathlib.Path(os.environ.get("MINITENSOR_TUTORIAL_OUT", "tutorial_figures")) / tutorial
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


class expect_error:
    """Run a deliberate mistake: label it, require the error it must raise, show that error.

    ::

        with expect_error("a misspelt hook name", PluginError) as caught:
            mt.plugins.register(Misspelt())
        assert "did you mean" in str(caught.error)

    prints ``(deliberate mistake: a misspelt hook name — the error below is expected)`` before
    the block and ``expected error: PluginError: ...`` (the message's first line) after it,
    and keeps the exception in ``caught.error`` for further checks. If the block raises none
    of ``errors`` the mistake went unnoticed, which is a real failure: an AssertionError says
    so, and any other exception propagates unchanged.
    """

    def __init__(self, mistake, *errors):
        if not errors:
            raise TypeError("expect_error needs at least one exception class")
        self.mistake = mistake
        self.errors = errors
        self.error = None

    def __enter__(self):
        print(f"(deliberate mistake: {self.mistake} — the error below is expected)")
        return self

    def __exit__(self, exc_type, exc, tb):
        names = " or ".join(e.__name__ for e in self.errors)
        if exc_type is None:
            raise AssertionError(f"deliberate mistake not caught: {self.mistake} raised no {names}")
        if not issubclass(exc_type, self.errors):
            return False  # an error nobody expected: let it stop the tutorial
        self.error = exc
        lines = str(exc).strip().splitlines() or [""]
        more = f" [... {len(lines) - 1} more lines]" if len(lines) > 1 else ""
        print(f"expected error: {exc_type.__name__}: {lines[0]}{more}")
        return True


# Figure titles, axis labels and legends in Chinese, keyed by the English text the code passes to
# ``text``. Terms as in tutorials/GLOSSARY.md. A label with fields keeps them: "w = {w:.2f}".
LABELS = {"zh": {}}
LABELS["zh"].update(
    {  # 01_attention_cues
        "newspaper": "报纸",
        "research paper": "研究论文",
        "coffee cup": "咖啡杯",
        "notebook": "笔记本",
        "book": "书",
        "(nothing in mind)": "（心中无所求）",
        "I want coffee": "我想喝咖啡",
        "I want to read": "我想读书",
        "I want to take notes": "我想记笔记",
        "average pooling (any query)": "平均汇聚（任意查询）",
        "attention weight": "注意力权重",
        "Keys (objects)": "键（物品）",
        "Queries (intentions)": "查询（意图）",
    }
)
LABELS["zh"].update(
    {  # 02_attention_pooling
        "truth  $2\\sin x + x^{0.8}$": "真实函数  $2\\sin x + x^{0.8}$",
        "prediction": "预测",
        "training samples": "训练样本",
        "average pooling (mse {mse:.2f})": "平均汇聚（mse {mse:.2f}）",
        "Nadaraya-Watson, Gaussian kernel (mse {mse:.2f})": "Nadaraya-Watson，高斯核（mse {mse:.2f}）",
        "Sorted training inputs (keys)": "排序后的训练输入（键）",
        "Sorted test inputs (queries)": "排序后的测试输入（查询）",
        "average pooling": "平均汇聚",
        "Gaussian kernel": "高斯核",
        "training points n": "训练点数 n",
        "mse against the truth": "相对真实函数的 mse",
        "Gaussian kernel, width $0.3\\,(n/50)^{-1/5}$": "高斯核，带宽 $0.3\\,(n/50)^{-1/5}$",
        "epoch": "迭代周期",
        "leave-one-out training loss": "留一法训练损失",
        "learned w = {w:.2f}": "学到的 w = {w:.2f}",
        "Gaussian, w = 1 (mse {mse:.2f})": "高斯核，w = 1（mse {mse:.2f}）",
        "parametric, learned w = {w:.2f} (mse {mse:.2f})": "带参数，学到的 w = {w:.2f}（mse {mse:.2f}）",
        "non-parametric, w = 1": "非参数，w = 1",
        "parametric, w = {w:.2f}": "带参数，w = {w:.2f}",
        "{kernel}, h = {width}: mse {mse:.3f}": "{kernel}，h = {width}：mse {mse:.3f}",
    }
)
LABELS["zh"].update(
    {  # 03_scoring_functions
        "Keys": "键",
        "Queries": "查询",
        "naive -inf: NaN row (blank)": "朴素的 -inf：NaN 行（空白）",
        "D2L -1e6: uniform row": "D2L 的 -1e6：均匀的行",
        "minitensor: zero row": "minitensor：全零的行",
        "example 1": "样本 1",
        "example 2": "样本 2",
        "$q^\\top k$: variance $d$": "$q^\\top k$：方差为 $d$",
        "$q^\\top k / \\sqrt{d}$: variance 1": "$q^\\top k / \\sqrt{d}$：方差为 1",
        "sequence length n = m": "序列长度 n = m",
        "forward + backward (ms)": "前向 + 反向传播（ms）",
    }
)
LABELS["zh"].update(
    {  # 04_write_a_scorer_plugin
        "keys (6-dim)": "键（6 维）",
        "queries (4-dim)": "查询（4 维）",
        "before training": "训练前",
        "trained, tau = 1": "训练后，tau = 1",
        "trained, tau = 0.25": "训练后，tau = 0.25",
    }
)
LABELS["zh"].update(
    {  # 05_multi_head_attention
        "keys (position: token)": "键（位置：词元）",
        "2 heads: head 1": "2 个头：头 1",
        "2 heads: head 2": "2 个头：头 2",
        "1 head": "1 个头",
        "2 heads": "2 个头",
        "step": "训练步数",
        "cross-entropy": "交叉熵",
        "training the neighbour task": "训练相邻词元任务",
    }
)
LABELS["zh"].update(
    {  # 06_self_attention_and_positional_encoding
        "CNN (Conv1d, k=3)": "CNN（Conv1d，k=3）",
        "RNN (GRU)": "RNN（GRU）",
        "self-attention": "自注意力",
        "CNN, k=3": "CNN，k=3",
        "CNN, k=5": "CNN，k=5",
        "sequence length n": "序列长度 n",
        "forward time (ms)": "前向传播时间（ms）",
        "time vs n (d = {d}, batch {batch}, 1 thread)": "时间随 n 的变化（d = {d}，批量 {batch}，单线程）",
        "{name}: layers": "{name}：层数",
        "RNN, one layer: n - 1 time steps": "RNN，单层：n - 1 个时间步",
        "layers (CNN, self-attention) or\ntime steps (RNN) from x_0 to y_(n-1)": (
            "从 x_0 到 y_(n-1) 的层数（CNN、自注意力）\n或时间步数（RNN）"
        ),
        "maximum path length": "最大路径长度",
        "output position j": "输出位置 j",
        "how far one layer carries x_0": "一层能把 x_0 传多远",
        "encoding dimension": "编码维度",
        "position i": "位置 i",
        "P (sinusoidal, d = 32)": "P（正弦位置编码，d = 32）",
        "col {col}": "第 {col} 列",
        "columns 6 to 9": "第 6 到 9 列",
        "bit (lowest first)": "二进制位（最低位在前）",
        "number": "数",
        "0..7 in binary": "0..7 的二进制表示",
        "rotary: constant diagonals": "旋转位置编码：对角线上为常数",
        "rotary": "旋转位置编码",
        "sinusoidal added to the inputs": "正弦位置编码加到输入上",
        "key position n": "键的位置 n",
        "query position m": "查询的位置 m",
        "sinusoidal added": "加上正弦位置编码",
        "relative position n - m": "相对位置 n - m",
        "score": "评分",
        "every score against n - m": "每个评分随 n - m 的分布",
    }
)
LABELS["zh"].update(
    {  # 07_transformer
        "source tokens": "源词元",
        "embedding x sqrt(d) + positional encoding": "嵌入 × sqrt(d) + 位置编码",
        "multi-head self-attention": "多头自注意力",
        "add & norm": "加法和规范化",
        "position-wise FFN": "基于位置的前馈网络",
        "encoder outputs H": "编码器输出 H",
        "target tokens, shifted right (<bos> first)": "目标词元，右移一位（<bos> 在前）",
        "masked multi-head self-attention": "掩蔽多头自注意力",
        "encoder-decoder attention": "编码器－解码器注意力",
        "linear -> vocabulary logits": "线性层 → 词表上的 logits",
        "softmax: P(next token)": "softmax：P(下一个词元)",
        "keys, values": "键、值",
        "queries": "查询",
        "The Transformer: an encoder-decoder for sequence pairs": "Transformer：处理序列对的编码器－解码器",
        "Transformer on the date task": "Transformer 在日期任务上的训练",
    }
)
LABELS["zh"].update(
    {  # 08_inside_the_engine
        "L = sum(softmax(Q K^T / sqrt(d)) V): tensors, Functions [backward order]": (
            "L = sum(softmax(Q K^T / sqrt(d)) V)：张量与 Function［反向传播的访问顺序］"
        ),
        "plain NumPy\n(reference.py)": "纯 NumPy\n(reference.py)",
        "numba kernel\n{threads} threads": "numba 融合计算内核\n{threads} 个线程",
        "numba kernel\n1 thread": "numba 融合计算内核\n1 个线程",
        "median time per call (ms)": "每次调用耗时的中位数（ms）",
        "softmax over the rows of a ({rows}, {cols}) float32 array": "对形状为 ({rows}, {cols}) 的 float32 数组逐行计算 softmax",
    }
)
LABELS["zh"].update(
    {  # 09_positions_as_score_biases
        "key position j": "键的位置 j",
        "query position i": "查询的位置 i",
        "head {h}: m = 1/{n}": "头 {h}：m = 1/{n}",
        "ALiBi: B[h, i, j] = -m_h |i - j|, 8 heads": "ALiBi：B[h, i, j] = -m_h |i - j|，8 个头",
        "bidirectional (encoder)": "双向（编码器）",
        "unidirectional (decoder)": "单向（解码器）",
        "relative position j - i (key minus query)": "相对位置 j - i（键的位置减查询的位置）",
        "bucket": "桶",
        "T5 buckets: exact near 0, log-spaced to ±128, then one": "T5 的分桶：0 附近逐个精确，到 ±128 按对数间隔，此后合为一个",
        "head 1's bias (random init., std 0.02)": "头 1 的偏置（随机初始化，标准差 0.02）",
        "allowed by the bias (B = 0)": "偏置允许的位置（B = 0）",
        "weights, window {window}": "权重，窗口 {window}",
        "weights, window {window} + causal mask": "权重，窗口 {window} + 因果掩蔽",
        "sliding window, head 1 (white: exactly 0)": "滑动窗口，头 1（白色：恰好为 0）",
    }
)
LABELS["zh"].update(
    {  # 10_flash_attention
        "plain (measured)": "普通路径（实测）",
        "fused (measured)": "流式路径（实测）",
        "one (T, T) array": "一个 (T, T) 数组",
        "sequence length T": "序列长度 T",
        "peak memory (MiB)": "峰值内存（MiB）",
        "causal, forward + backward, {heads} heads": "因果掩蔽，前向 + 反向传播，{heads} 个头",
        "key position": "键的位置",
        "query position": "查询的位置",
        "head {h} (ALiBi slope 1/{inverse:.0f})": "头 {h}（ALiBi 斜率 1/{inverse:.0f}）",
        "streamed attention: memory linear in T; weights recomputed on demand from lse (last 48 queries)": (
            "流式注意力：内存随 T 线性增长；权重由 lse 按需重算（最后 48 个查询）"
        ),
    }
)
LABELS["zh"].update(
    {  # 11_bahdanau_attention
        "without attention (context = last state)": "无注意力（上下文变量 = 最后的隐状态）",
        "Bahdanau attention (additive)": "Bahdanau 注意力（加性）",
        "input length n (letters)": "输入长度 n（字母数）",
        "held-out exact match": "留出集上的精确匹配",
        "reversing strings: the fixed context is a bottleneck": "反转字符串：固定的上下文变量是瓶颈",
        "Bahdanau attention, reversing {source}": "Bahdanau 注意力，反转 {source}",
    }
)
LABELS["zh"].update(
    {  # 13_vision_transformer
        "horizontal": "横笔画",
        "vertical": "竖笔画",
        "diagonal": "斜笔画",
        "square": "正方形",
        "image": "图像",
        "<cls> attention": "<cls> 的注意力",
        "ViT: the last block's <cls> attention over the 4 x 4 patches": "ViT：最后一个块中 <cls> 对 4 x 4 个图像块的注意力",
    }
)


def _use_cjk_font():
    """Put a CJK font first for every figure of a Chinese tutorial; None (and one warning) if none.

    The font is ``minitensor.i18n.cjk_font``'s, and so is the warning, given once for the
    tutorial's figures and the library's (``plot_loss(..., lang=LANG)`` ...) together."""
    family = font_for(LANG)
    if family is None:
        return None
    import matplotlib

    matplotlib.rcParams["font.family"] = "sans-serif"
    matplotlib.rcParams["font.sans-serif"] = [family, *matplotlib.rcParams["font.sans-serif"]]
    matplotlib.rcParams["axes.unicode_minus"] = False  # "-" on the axes: CJK fonts may lack U+2212
    return family


FONT = _use_cjk_font() if LANG != "en" else None


def text(english, **fields):
    """A figure title or label in the tutorial's language: ``ax.set_title(text("attention weight"))``.

    English returns ``english`` itself; Chinese looks it up in ``LABELS["zh"]``, then in the
    library's own labels (``minitensor.i18n.LABELS``: "head {h}", the kernels' names ...); a label
    missing from both is a KeyError, so no figure is half translated. ``fields`` fill the label's
    ``{placeholders}`` after the look-up: ``text("learned w = {w:.2f}", w=w)``. Without a CJK
    font, Chinese tutorials keep the English labels (see ``minitensor.i18n.cjk_font``).
    """
    words = english
    if LANG != "en" and FONT is not None:
        words = LABELS[LANG].get(english, LIBRARY_LABELS.get(LANG, {}).get(english))
        if words is None:
            raise KeyError(f"text({english!r}): no {LANG!r} label in tutorials/_tutorial.py's LABELS")
    return words.format(**fields) if fields else words

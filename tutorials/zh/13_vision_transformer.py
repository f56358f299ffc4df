# %% [markdown]
# # 13. 视觉 Transformer：在图像块之间做注意力
#
# 教程 7 的 Transformer 读的是词元序列。Dosovitskiy 等人（2021）改为给它一幅图像：把图像切成
# 正方形的图像块，用同一个线性映射把每个块变成一个词元，在最前面放一个可学习的分类词元（<cls>），
# 让编码器的自注意力从第一层起就把每个块与其他所有块联系起来。卷积只看到自己的邻域，
# 视野要一层一层地扩大；而这里任意两个块之间的最大路径长度是 1，正是教程 6 的比较。
#
# 本教程用 minitensor 写出《动手学深度学习》的视觉 Transformer（ViT），写法与书中的 PyTorch 代码相同：
#
# 1. 图像块嵌入：一个卷积核大小等于步幅的卷积，并验证它就是展平后图像块上的线性映射；
# 2. ViT 块：先做规范化的 Transformer 编码器块，前馈部分是带 GELU 的多层感知机；
# 3. 整个模型：<cls> 词元和可学习的位置编码；
# 4. 在生成的四种形状的小图像上训练它，并看它的 <cls> 词元在看哪里。
#
# 运行方式：`python tutorials/zh/13_vision_transformer.py`（在 2 个 CPU 核上约需十秒），
# 或用 jupytext 把它作为笔记本打开。设置 `MINITENSOR_TUTORIAL_SMOKE=1` 会把一切缩小到几秒钟。
#
# 参考资料：英文版 *Dive into Deep Learning*（d2l.ai）11.8 "Transformers for Vision"，它建立在
# 11.7 "The Transformer Architecture" 之上；中文版《动手学深度学习》（zh.d2l.ai）的注意力机制一章
# 没有视觉一节，其中的 Transformer 见 10.7 Transformer。论文：Dosovitskiy et al. (2021),
# "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale"，arXiv:2010.11929。
# 书中用 Fashion-MNIST 训练，那需要下载；这里的图像是生成的，运行时不需要网络。

# %%
import time

import numpy as np
from _tutorial import SMOKE, figure_path, pick, text  # text()：图中的文字随教程的语言而变

import minitensor as mt
from minitensor import nn

T = "13_vision_transformer"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## 图像
#
# 每幅图像是单通道的 16 x 16 像素，在随机的位置、以随机的大小画着四种形状之一：横笔画、竖笔画、
# 斜笔画和正方形的轮廓，上面叠加了很强的噪声。单独一个 4 x 4 的图像块分不出这些形状
# （正方形一条边上的块看起来和笔画上的块一样）：类别在于各个块之间的关系。

# %%
CLASSES = ["horizontal", "vertical", "diagonal", "square"]
IMG_SIZE = 16


def make_images(n, seed):
    # n 幅图像 (n, 1, 16, 16) float32 及其标签 (n,) int64：第 i 幅画的是类别 i % 4 的形状
    """n images (n, 1, 16, 16) float32 and their labels (n,) int64: image i shows class i % 4."""
    rng = np.random.default_rng(seed)
    X = rng.normal(0.0, 0.45, (n, 1, IMG_SIZE, IMG_SIZE)).astype(np.float32)
    y = np.arange(n) % 4
    for image, label in zip(X[:, 0], y):
        length = rng.integers(5, 11)
        r, c = rng.integers(0, IMG_SIZE - length + 1, size=2)
        if label == 0:
            image[r + length // 2, c : c + length] += 1
        elif label == 1:
            image[r : r + length, c + length // 2] += 1
        elif label == 2:
            image[r + np.arange(length), c + np.arange(length)] += 1
        else:
            side = length - 1
            image[r, c : c + side + 1] += 1
            image[r + side, c : c + side + 1] += 1
            image[r : r + side + 1, c] += 1
            image[r : r + side + 1, c + side] += 1
    return X, y


num_train, num_test = pick(8000, 512), pick(1000, 256)
X_train, y_train = make_images(num_train, seed=1)
X_test, y_test = make_images(num_test, seed=2)
print("train", X_train.shape, "test", X_test.shape, "classes", CLASSES)

# %% [markdown]
# ## 图像块嵌入
#
# 把图像 $\mathbf X \in \mathbb R^{c \times h \times w}$ 切成 $p \times p$ 像素的块，得到
# $m = hw/p^2$ 个图像块。每块展平成 $cp^2$ 个数的向量，再用同一个可学习的矩阵映射到 `num_hiddens` 维。
# 书中把这个映射写成卷积核大小和步幅都是 $p$ 的卷积：它的窗口恰好就是这些图像块，彼此不重叠，
# 每个输出位置就是卷积核与一个图像块的点积。随后 `flatten(2).transpose(1, 2)` 把
# $\sqrt m \times \sqrt m$ 的输出网格逐行排成 $m$ 个词元的序列。


# %%
class PatchEmbedding(nn.Module):
    def __init__(self, img_size=96, patch_size=16, num_hiddens=512):
        super().__init__()

        def _make_tuple(x):
            if not isinstance(x, (list, tuple)):
                return (x, x)
            return x

        img_size, patch_size = _make_tuple(img_size), _make_tuple(patch_size)
        self.num_patches = (img_size[0] // patch_size[0]) * (img_size[1] // patch_size[1])
        self.conv = nn.LazyConv2d(num_hiddens, kernel_size=patch_size, stride=patch_size)

    def forward(self, X):
        # 输出形状：（批量大小，图像块数，通道数）
        return self.conv(X).flatten(2).transpose(1, 2)


patch_size, num_hiddens = 4, 32
patch_emb = PatchEmbedding(IMG_SIZE, patch_size, num_hiddens)
X = mt.tensor(X_train[:4])
Y = patch_emb(X)
print("patch embedding:", X.shape, "->", Y.shape)
assert Y.shape == (4, (IMG_SIZE // patch_size) ** 2, num_hiddens)

# %% [markdown]
# 这个卷积*就是*展平后图像块上的线性映射：手工切出图像块并展平，再乘以卷积自己的权重。

# %%
b, c, g = X.shape[0], X.shape[1], IMG_SIZE // patch_size  # g x g 个图像块
patches = X.reshape(b, c, g, patch_size, g, patch_size).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, -1)
W = patch_emb.conv.weight.reshape(num_hiddens, -1)  # (num_hiddens, c p^2)：卷积自己的权重
by_hand = patches @ W.T + patch_emb.conv.bias
print("largest difference from the linear map on patches:", float((by_hand - Y).abs().max()))
assert np.allclose(by_hand.numpy(), Y.numpy(), atol=1e-5), "the patch embedding is one linear map per patch"

# %% [markdown]
# ## ViT 块
#
# 这个编码器块与教程 7 的有两处不同。规范化放在每个子层*之前*（pre-LN；教程 7 的勘误说明了
# 为什么这样训练更稳定），逐位置的网络是用 GELU 激活函数的多层感知机，GELU 是更平滑的 ReLU（BERT 和 GPT 也用它）：
#
# $$\mathbf X \leftarrow \mathbf X + \text{MultiHead}(\text{LN}(\mathbf X)),\qquad
# \mathbf X \leftarrow \mathbf X + \text{MLP}(\text{LN}(\mathbf X)).$$
#
# 块保持形状（批量，词元，`num_hiddens`）不变，因此块可以堆叠。


# %%
class ViTMLP(nn.Module):
    def __init__(self, mlp_num_hiddens, mlp_num_outputs, dropout=0.5):
        super().__init__()
        self.dense1 = nn.LazyLinear(mlp_num_hiddens)
        self.gelu = nn.GELU()
        self.dropout1 = nn.Dropout(dropout)
        self.dense2 = nn.LazyLinear(mlp_num_outputs)
        self.dropout2 = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout2(self.dense2(self.dropout1(self.gelu(self.dense1(x)))))


class ViTBlock(nn.Module):
    def __init__(self, num_hiddens, norm_shape, mlp_num_hiddens, num_heads, dropout, use_bias=False):
        super().__init__()
        self.ln1 = nn.LayerNorm(norm_shape)
        self.attention = nn.MultiHeadAttention(num_hiddens, num_heads, dropout, bias=use_bias)
        self.ln2 = nn.LayerNorm(norm_shape)
        self.mlp = ViTMLP(mlp_num_hiddens, num_hiddens, dropout)

    def forward(self, X, valid_lens=None):
        X = X + self.attention(*([self.ln1(X)] * 3), valid_lens)
        return X + self.mlp(self.ln2(X))


blk = ViTBlock(num_hiddens, num_hiddens, 4 * num_hiddens, num_heads=4, dropout=0.5)
blk.eval()
print("ViT block:", Y.shape, "->", blk(Y).shape)
assert blk(Y).shape == Y.shape

# %% [markdown]
# ## 视觉 Transformer
#
# 一个可学习的 <cls> 词元放在 $m$ 个图像块词元之前，再给全部 $m + 1$ 个词元加上可学习的位置编码
# （每个位置一个向量，而不是教程 6 的正弦和余弦）。经过各个块之后，只把 <cls> 词元的表示送入分类头：
# 通过自注意力，它已经从每个图像块收集了所需的信息。


# %%
class ViT(nn.Module):
    """Vision Transformer."""  # 视觉 Transformer

    def __init__(
        self,
        img_size,
        patch_size,
        num_hiddens,
        mlp_num_hiddens,
        num_heads,
        num_blks,
        emb_dropout,
        blk_dropout,
        use_bias=False,
        num_classes=10,
    ):
        super().__init__()
        self.patch_embedding = PatchEmbedding(img_size, patch_size, num_hiddens)
        self.cls_token = nn.Parameter(mt.zeros(1, 1, num_hiddens))
        num_steps = self.patch_embedding.num_patches + 1  # 加上 cls 词元
        # 位置编码是可学习的
        self.pos_embedding = nn.Parameter(mt.randn(1, num_steps, num_hiddens) * 0.02)
        self.dropout = nn.Dropout(emb_dropout)
        self.blks = nn.Sequential()
        for i in range(num_blks):
            self.blks.add_module(
                f"{i}", ViTBlock(num_hiddens, num_hiddens, mlp_num_hiddens, num_heads, blk_dropout, use_bias)
            )
        self.head = nn.Sequential(nn.LayerNorm(num_hiddens), nn.Linear(num_hiddens, num_classes))

    def forward(self, X):
        X = self.patch_embedding(X)
        X = mt.cat((self.cls_token.expand(X.shape[0], -1, -1), X), 1)
        X = self.dropout(X + self.pos_embedding)
        for blk in self.blks:
            X = blk(X)
        return self.head(X[:, 0])


model = ViT(
    IMG_SIZE, patch_size, num_hiddens, 2 * num_hiddens, num_heads=4, num_blks=2,
    emb_dropout=0.1, blk_dropout=0.1, num_classes=len(CLASSES),
)  # fmt: skip
print("logits:", model(mt.tensor(X_train[:2])).shape)
print(f"{sum(p.numel() for p in model.parameters()):,} parameters")

# %% [markdown]
# ## 训练
#
# 对分类头的输出用交叉熵损失，优化器为 Adam，小批量大小为 64。随机猜测的准确率是 25%。


# %%
def accuracy(model, X, y):
    model.eval()
    with mt.no_grad():
        predicted = np.concatenate([model(mt.tensor(X[i : i + 256])).numpy().argmax(-1) for i in range(0, len(X), 256)])
    model.train()
    return float((predicted == y).mean())


epochs, batch_size = pick(15, 3), 64
optimizer = mt.optim.Adam(model.parameters(), lr=3e-3)
rng = np.random.default_rng(0)
losses, started = [], time.perf_counter()
for epoch in range(epochs):
    order, total = rng.permutation(num_train), 0.0
    for i in range(0, num_train, batch_size):
        rows = order[i : i + batch_size]
        loss = nn.functional.cross_entropy(model(mt.tensor(X_train[rows])), mt.tensor(y_train[rows]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(rows)
    losses.append(total / num_train)
    print(f"epoch {epoch + 1:2d}  train loss {losses[-1]:.3f}  test accuracy {accuracy(model, X_test, y_test):.1%}")
test_accuracy = accuracy(model, X_test, y_test)
print(f"{time.perf_counter() - started:.1f} s; held-out accuracy {test_accuracy:.1%} (chance 25%)")
assert losses[-1] < losses[0], "training lowers the loss"
assert test_accuracy > pick(0.9, 0.3), f"the ViT tells the four shapes apart: {test_accuracy:.1%}"

# %% [markdown]
# ## <cls> 词元在看哪里
#
# 取最后一个块中 <cls> 词元（查询 0）对 16 个图像块（键 1 到 16）的注意力权重，对各个头取平均，
# 再放回 4 x 4 的图像块网格上：对每种形状，这就是分类所依据的那些图像块。

# %%
from matplotlib.figure import Figure

model.eval()
examples = [int(np.flatnonzero(y_test == k)[0]) for k in range(len(CLASSES))]
with mt.no_grad():
    model(mt.tensor(X_test[examples]))
weights = model.blks[-1].attention.attention_weights.numpy()  # （批量 * 头数，查询，键）
weights = weights.reshape(len(examples), -1, weights.shape[-2], weights.shape[-1]).mean(axis=1)
cls_on_patches = weights[:, 0, 1:].reshape(len(examples), g, g)
assert np.allclose(weights[:, 0].sum(-1), 1.0, atol=1e-5), "the <cls> token's weights sum to 1"

fig = Figure(figsize=(8, 4.4))
axes = fig.subplots(2, len(CLASSES))
for k, index in enumerate(examples):
    axes[0, k].imshow(X_test[index, 0], cmap="gray")
    axes[0, k].set_title(text(CLASSES[k]))
    axes[1, k].imshow(cls_on_patches[k], cmap="viridis")
    for ax in axes[:, k]:
        ax.set_xticks([])
        ax.set_yticks([])
axes[0, 0].set_ylabel(text("image"))
axes[1, 0].set_ylabel(text("<cls> attention"))
fig.suptitle(text("ViT: the last block's <cls> attention over the 4 x 4 patches"))
fig.tight_layout()
fig.savefig(figure_path(T, "cls_attention.png"), dpi=110)
print("wrote", figure_path(T, "cls_attention.png"))

# %% [markdown]
# ## 小结
#
# * 视觉 Transformer 把图像切成图像块，用同一个线性映射（卷积核大小等于步幅的卷积）嵌入每一块；
#   再加上 <cls> 词元和可学习的位置编码。
# * 它的块是 Transformer 编码器块，每个子层之前做规范化，前馈部分是带 GELU 的多层感知机；
#   只对 <cls> 词元的输出做分类。
# * 自注意力在一层之内就连接了任意两个图像块。在数以百万计的图像上，这使 ViT 胜过卷积神经网络；
#   在小数据集上，自带局部性的卷积通常更好（《动手学深度学习》英文版 11.8）。
#
# ## 练习
#
# 1. 取 2 x 2 和 8 x 8 像素的图像块（`patch_size`）。词元数、每个迭代周期的时间和准确率如何变化？
#    为什么图像块越小，注意力的代价增长得这么快？
# 2. 去掉位置编码（把 `model.pos_embedding` 置零并冻结）。模型还能分清横笔画和竖笔画吗？为什么？
# 3. 用所有图像块词元的平均代替 <cls> 词元来分类。它训练得一样好吗？
# 4. 用参数量相当的小卷积神经网络（`nn.Conv2d`、`nn.BatchNorm2d`、`nn.ReLU`）代替 ViT，
#    比较相同迭代周期数之后的准确率。

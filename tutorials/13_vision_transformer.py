# %% [markdown]
# # 13. The vision Transformer: attention over the patches of an image
#
# The Transformer of tutorial 7 reads a sequence of tokens. Dosovitskiy et al. (2021) gave it
# an image instead: cut the image into square patches (图像块), turn each patch into a token
# with one linear map, put a learned classification token (分类词元, <cls>) in front, and let
# the encoder's self-attention (自注意力) relate every patch to every other from the first
# layer on. A convolution sees only its neighbourhood and grows its view layer by layer; here
# the maximum path length (最大路径长度) between two patches is 1, the comparison of tutorial 6.
#
# This tutorial writes D2L's vision Transformer (ViT) with minitensor, as the book writes it in
# PyTorch:
#
# 1. the patch embedding (图像块嵌入), a convolution whose kernel equals its stride, checked
#    against the linear map on flattened patches that it is;
# 2. the ViT block, a pre-normalisation Transformer encoder block with a GELU MLP;
# 3. the model, with the <cls> token and learned positional embeddings (位置编码);
# 4. training it on small generated images of four shapes, and where its <cls> token looks.
#
# Run it as `python tutorials/13_vision_transformer.py` (about ten seconds on 2 CPU cores) or
# open it as a notebook with jupytext. `MINITENSOR_TUTORIAL_SMOKE=1` shrinks everything to a few
# seconds.
#
# Sources: the English edition *Dive into Deep Learning* (d2l.ai), 11.8 "Transformers for
# Vision", which builds on 11.7 "The Transformer Architecture"; the Chinese edition
# 《动手学深度学习》 (zh.d2l.ai) has no vision section in its attention chapter, and its
# Transformer is 10.7 Transformer. Paper: Dosovitskiy et al. (2021), "An Image is Worth 16x16
# Words: Transformers for Image Recognition at Scale", arXiv:2010.11929. D2L trains on
# Fashion-MNIST, which would have to be downloaded; the images here are generated, so the run
# needs no network.

# %%
import time

import numpy as np
from _tutorial import SMOKE, figure_path, pick, text  # text(): figure labels in the tutorial's language

import minitensor as mt
from minitensor import nn

T = "13_vision_transformer"
mt.manual_seed(0)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## The images
#
# Each image is 16 x 16 pixels of one channel, with one of four shapes at a random place and
# size: a horizontal stroke, a vertical stroke, a diagonal stroke and the outline of a square,
# under heavy noise. No single 4 x 4 patch tells the shapes apart (a patch of a square's side
# looks like a patch of a stroke): the class lies in how the patches relate.

# %%
CLASSES = ["horizontal", "vertical", "diagonal", "square"]
IMG_SIZE = 16


def make_images(n, seed):
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
# ## Patch embedding
#
# An image $\mathbf X \in \mathbb R^{c \times h \times w}$ cut into patches of $p \times p$
# pixels gives $m = hw/p^2$ patches. Each is flattened to a vector of $cp^2$ numbers and mapped
# to `num_hiddens` by one learned matrix, the same for every patch. D2L writes that map as a
# convolution with kernel size and stride both $p$: its windows are exactly the patches, they
# do not overlap, and each output position is the filters' dot product with one patch.
# `flatten(2).transpose(1, 2)` then lays the $\sqrt m \times \sqrt m$ grid of outputs out as a
# sequence of $m$ tokens, row by row.


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
        # Output shape: (batch size, no. of patches, no. of channels)
        return self.conv(X).flatten(2).transpose(1, 2)


patch_size, num_hiddens = 4, 32
patch_emb = PatchEmbedding(IMG_SIZE, patch_size, num_hiddens)
X = mt.tensor(X_train[:4])
Y = patch_emb(X)
print("patch embedding:", X.shape, "->", Y.shape)
assert Y.shape == (4, (IMG_SIZE // patch_size) ** 2, num_hiddens)

# %% [markdown]
# The convolution *is* the linear map on flattened patches: cut the image by hand, flatten each
# patch, and multiply by the convolution's own weights.

# %%
b, c, g = X.shape[0], X.shape[1], IMG_SIZE // patch_size  # g x g patches
patches = X.reshape(b, c, g, patch_size, g, patch_size).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, -1)
W = patch_emb.conv.weight.reshape(num_hiddens, -1)  # (num_hiddens, c p^2)
by_hand = patches @ W.T + patch_emb.conv.bias
print("largest difference from the linear map on patches:", float((by_hand - Y).abs().max()))
assert np.allclose(by_hand.numpy(), Y.numpy(), atol=1e-5), "the patch embedding is one linear map per patch"

# %% [markdown]
# ## The ViT block
#
# The encoder block differs from tutorial 7's in two places. Normalisation comes *before* each
# sublayer (pre-LN; tutorial 7's errata note explains why it trains more stably), and the
# position-wise network is an MLP with the GELU activation, a smoother ReLU (BERT and GPT use it too):
#
# $$\mathbf X \leftarrow \mathbf X + \text{MultiHead}(\text{LN}(\mathbf X)),\qquad
# \mathbf X \leftarrow \mathbf X + \text{MLP}(\text{LN}(\mathbf X)).$$
#
# The block keeps the shape (batch, tokens, `num_hiddens`), so blocks stack.


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
# ## The vision Transformer
#
# A learned <cls> token goes in front of the $m$ patch tokens, and learned positional
# embeddings (one vector per place, not tutorial 6's sines and cosines) are added to all
# $m + 1$. After the blocks, the <cls> token's representation alone feeds the classification
# head: through self-attention it has gathered what it needs from every patch.


# %%
class ViT(nn.Module):
    """Vision Transformer."""

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
        num_steps = self.patch_embedding.num_patches + 1  # Add the cls token
        # Positional embeddings are learnable
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
# ## Training
#
# Cross-entropy on the head's logits, Adam, minibatches of 64. Chance is 25%.


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
# ## Where the <cls> token looks
#
# The last block's attention weights of the <cls> token (query 0) over the 16 patches (keys 1
# to 16), averaged over the heads, laid back on the 4 x 4 grid of patches: for each shape, the
# patches the classification is read from.

# %%
from matplotlib.figure import Figure

model.eval()
examples = [int(np.flatnonzero(y_test == k)[0]) for k in range(len(CLASSES))]
with mt.no_grad():
    model(mt.tensor(X_test[examples]))
weights = model.blks[-1].attention.attention_weights.numpy()  # (batch * heads, queries, keys)
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
# ## Summary
#
# * A vision Transformer cuts an image into patches and embeds each with the same linear map
#   (a convolution whose kernel equals its stride); a <cls> token and learned positional
#   embeddings join them.
# * Its blocks are Transformer encoder blocks with normalisation before each sublayer and a
#   GELU MLP; the <cls> token's output alone is classified.
# * Self-attention links every pair of patches in one layer. On millions of images this lets
#   ViT outperform convolutional networks; on small datasets convolutions, with their built-in
#   locality, usually do better (D2L 11.8).
#
# ## Exercises
#
# 1. Take patches of 2 x 2 and of 8 x 8 pixels (`patch_size`). How do the number of tokens,
#    the time per epoch and the accuracy change? Why does attention's cost grow so fast with
#    smaller patches?
# 2. Remove the positional embeddings (`model.pos_embedding` set to zeros and frozen). Can the
#    model still tell a horizontal from a vertical stroke? Why, or why not?
# 3. Classify the average of all patch tokens instead of the <cls> token. Does it train as well?
# 4. Replace the ViT by a small convolutional network (`nn.Conv2d`, `nn.BatchNorm2d`, `nn.ReLU`)
#    with about as many parameters, and compare the accuracy after the same number of epochs.

"""D2L's attention chapter as the book writes it in PyTorch (d2l.ai, chapters 10.7 and 11), written
once here for any ``torch``-like namespace: ``chapter_of(torch, torch.nn, torch.nn.functional)``
or ``chapter_of(mt, mt.nn, mt.nn.functional)``. It follows the book's PyTorch code closely (its
names, its ``LazyLinear`` layers, ``sequence_mask``'s ``X[~mask] = value``, ``bmm``,
``repeat_interleave``): the point is to run what a reader of the book runs (the book's sample
code is under a modified MIT licence, d2l.ai). Used by ``tests/test_d2l_habits.py`` (both
libraries give the same numbers) and by ``bench/d2l_book.py`` (how fast each runs it). Imports
nothing but ``math``."""

import math


def chapter_of(torch, nn, F):
    """The attention chapter's code, as the book writes it in PyTorch, for any ``torch``-like
    namespace: a dict of its functions and classes."""

    def sequence_mask(X, valid_len, value=0):  # 10.7's: positions past each valid length
        maxlen = X.size(1)
        mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
        X[~mask] = value
        return X

    def masked_softmax(X, valid_lens):  # 11.3.1
        if valid_lens is None:
            return F.softmax(X, dim=-1)
        shape = X.shape
        if valid_lens.dim() == 1:
            valid_lens = torch.repeat_interleave(valid_lens, shape[1])
        else:
            valid_lens = valid_lens.reshape(-1)
        X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
        return F.softmax(X.reshape(shape), dim=-1)

    class AdditiveAttention(nn.Module):  # 11.3.2
        def __init__(self, num_hiddens, dropout):
            super().__init__()
            self.W_k = nn.LazyLinear(num_hiddens, bias=False)
            self.W_q = nn.LazyLinear(num_hiddens, bias=False)
            self.w_v = nn.LazyLinear(1, bias=False)
            self.dropout = nn.Dropout(dropout)

        def forward(self, queries, keys, values, valid_lens):
            queries, keys = self.W_q(queries), self.W_k(keys)
            features = torch.tanh(queries.unsqueeze(2) + keys.unsqueeze(1))
            scores = self.w_v(features).squeeze(-1)
            self.attention_weights = masked_softmax(scores, valid_lens)
            return torch.bmm(self.dropout(self.attention_weights), values)

    class DotProductAttention(nn.Module):  # 11.3.3
        def __init__(self, dropout):
            super().__init__()
            self.dropout = nn.Dropout(dropout)

        def forward(self, queries, keys, values, valid_lens=None):
            d = queries.shape[-1]
            scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
            self.attention_weights = masked_softmax(scores, valid_lens)
            return torch.bmm(self.dropout(self.attention_weights), values)

    class MultiHeadAttention(nn.Module):  # 11.5
        def __init__(self, num_hiddens, num_heads, dropout, bias=False):
            super().__init__()
            self.num_heads = num_heads
            self.attention = DotProductAttention(dropout)
            self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
            self.W_k = nn.LazyLinear(num_hiddens, bias=bias)
            self.W_v = nn.LazyLinear(num_hiddens, bias=bias)
            self.W_o = nn.LazyLinear(num_hiddens, bias=bias)

        def transpose_qkv(self, X):
            X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1)
            X = X.permute(0, 2, 1, 3)
            return X.reshape(-1, X.shape[2], X.shape[3])

        def transpose_output(self, X):
            X = X.reshape(-1, self.num_heads, X.shape[1], X.shape[2])
            X = X.permute(0, 2, 1, 3)
            return X.reshape(X.shape[0], X.shape[1], -1)

        def forward(self, queries, keys, values, valid_lens):
            queries = self.transpose_qkv(self.W_q(queries))
            keys = self.transpose_qkv(self.W_k(keys))
            values = self.transpose_qkv(self.W_v(values))
            if valid_lens is not None:
                valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
            output = self.attention(queries, keys, values, valid_lens)
            return self.W_o(self.transpose_output(output))

    class PositionalEncoding(nn.Module):  # 11.6.3
        def __init__(self, num_hiddens, dropout, max_len=1000):
            super().__init__()
            self.dropout = nn.Dropout(dropout)
            self.P = torch.zeros((1, max_len, num_hiddens))
            X = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
                10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens
            )
            self.P[:, :, 0::2] = torch.sin(X)
            self.P[:, :, 1::2] = torch.cos(X)

        def forward(self, X):
            X = X + self.P[:, : X.shape[1], :].to(X.device)
            return self.dropout(X)

    class PositionWiseFFN(nn.Module):  # 11.7.2
        def __init__(self, ffn_num_hiddens, ffn_num_outputs):
            super().__init__()
            self.dense1 = nn.LazyLinear(ffn_num_hiddens)
            self.relu = nn.ReLU()
            self.dense2 = nn.LazyLinear(ffn_num_outputs)

        def forward(self, X):
            return self.dense2(self.relu(self.dense1(X)))

    def layer_norm_and_batch_norm():  # 11.7.2: each example normalised, against each feature
        ln = nn.LayerNorm(2)
        bn = nn.LazyBatchNorm1d()
        X = torch.tensor([[1, 2], [2, 3]], dtype=torch.float32)
        # Compute mean and variance from X in the training mode
        return ln(X), bn(X), bn

    class AddNorm(nn.Module):  # 11.7.3
        def __init__(self, norm_shape, dropout):
            super().__init__()
            self.dropout = nn.Dropout(dropout)
            self.ln = nn.LayerNorm(norm_shape)

        def forward(self, X, Y):
            return self.ln(self.dropout(Y) + X)

    class TransformerEncoderBlock(nn.Module):  # 11.7.4
        def __init__(self, num_hiddens, ffn_num_hiddens, num_heads, dropout, use_bias=False):
            super().__init__()
            self.attention = MultiHeadAttention(num_hiddens, num_heads, dropout, use_bias)
            self.addnorm1 = AddNorm(num_hiddens, dropout)
            self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens)
            self.addnorm2 = AddNorm(num_hiddens, dropout)

        def forward(self, X, valid_lens):
            Y = self.addnorm1(X, self.attention(X, X, X, valid_lens))
            return self.addnorm2(Y, self.ffn(Y))

    class TransformerEncoder(nn.Module):
        def __init__(self, vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout):
            super().__init__()
            self.num_hiddens = num_hiddens
            self.embedding = nn.Embedding(vocab_size, num_hiddens)
            self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
            self.blks = nn.Sequential()
            for i in range(num_blks):
                self.blks.add_module(
                    "block" + str(i), TransformerEncoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout)
                )

        def forward(self, X, valid_lens):
            X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
            self.attention_weights = [None] * len(self.blks)
            for i, blk in enumerate(self.blks):
                X = blk(X, valid_lens)
                self.attention_weights[i] = blk.attention.attention.attention_weights
            return X

    class TransformerDecoderBlock(nn.Module):  # 11.7.5
        def __init__(self, num_hiddens, ffn_num_hiddens, num_heads, dropout, i):
            super().__init__()
            self.i = i
            self.attention1 = MultiHeadAttention(num_hiddens, num_heads, dropout)
            self.addnorm1 = AddNorm(num_hiddens, dropout)
            self.attention2 = MultiHeadAttention(num_hiddens, num_heads, dropout)
            self.addnorm2 = AddNorm(num_hiddens, dropout)
            self.ffn = PositionWiseFFN(ffn_num_hiddens, num_hiddens)
            self.addnorm3 = AddNorm(num_hiddens, dropout)

        def forward(self, X, state):
            enc_outputs, enc_valid_lens = state[0], state[1]
            key_values = X if state[2][self.i] is None else torch.cat((state[2][self.i], X), dim=1)
            state[2][self.i] = key_values
            if self.training:
                batch_size, num_steps, _ = X.shape
                dec_valid_lens = torch.arange(1, num_steps + 1, device=X.device).repeat(batch_size, 1)
            else:
                dec_valid_lens = None
            X2 = self.attention1(X, key_values, key_values, dec_valid_lens)
            Y = self.addnorm1(X, X2)
            Y2 = self.attention2(Y, enc_outputs, enc_outputs, enc_valid_lens)
            Z = self.addnorm2(Y, Y2)
            return self.addnorm3(Z, self.ffn(Z)), state

    class TransformerDecoder(nn.Module):
        def __init__(self, vocab_size, num_hiddens, ffn_num_hiddens, num_heads, num_blks, dropout):
            super().__init__()
            self.num_hiddens, self.num_blks = num_hiddens, num_blks
            self.embedding = nn.Embedding(vocab_size, num_hiddens)
            self.pos_encoding = PositionalEncoding(num_hiddens, dropout)
            self.blks = nn.Sequential()
            for i in range(num_blks):
                self.blks.add_module(
                    "block" + str(i), TransformerDecoderBlock(num_hiddens, ffn_num_hiddens, num_heads, dropout, i)
                )
            self.dense = nn.LazyLinear(vocab_size)

        def init_state(self, enc_outputs, enc_valid_lens):
            return [enc_outputs, enc_valid_lens, [None] * self.num_blks]

        def forward(self, X, state):
            X = self.pos_encoding(self.embedding(X) * math.sqrt(self.num_hiddens))
            for blk in self.blks:
                X, state = blk(X, state)
            return self.dense(X), state

    class Seq2SeqEncoder(nn.Module):  # 10.7.2: a GRU over the embedded tokens, time-major
        def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0):
            super().__init__()
            self.embedding = nn.Embedding(vocab_size, embed_size)
            self.rnn = nn.GRU(embed_size, num_hiddens, num_layers, dropout=dropout)

        def forward(self, X, *args):
            embs = self.embedding(X.t().type(torch.int64))
            outputs, state = self.rnn(embs)
            return outputs, state

    class Seq2SeqAttentionDecoder(nn.Module):  # 11.4.2: Bahdanau attention over the encoder's outputs
        def __init__(self, vocab_size, embed_size, num_hiddens, num_layers, dropout=0):
            super().__init__()
            self.attention = AdditiveAttention(num_hiddens, dropout)
            self.embedding = nn.Embedding(vocab_size, embed_size)
            self.rnn = nn.GRU(embed_size + num_hiddens, num_hiddens, num_layers, dropout=dropout)
            self.dense = nn.LazyLinear(vocab_size)

        def init_state(self, enc_outputs, enc_valid_lens):
            outputs, hidden_state = enc_outputs
            return (outputs.permute(1, 0, 2), hidden_state, enc_valid_lens)

        def forward(self, X, state):
            enc_outputs, hidden_state, enc_valid_lens = state
            X = self.embedding(X).permute(1, 0, 2)
            outputs, self._attention_weights = [], []
            for x in X:
                query = torch.unsqueeze(hidden_state[-1], dim=1)
                context = self.attention(query, enc_outputs, enc_outputs, enc_valid_lens)
                x = torch.cat((context, torch.unsqueeze(x, dim=1)), dim=-1)
                out, hidden_state = self.rnn(x.permute(1, 0, 2), hidden_state)
                outputs.append(out)
                self._attention_weights.append(self.attention.attention_weights)
            outputs = self.dense(torch.cat(outputs, dim=0))
            return outputs.permute(1, 0, 2), [enc_outputs, hidden_state, enc_valid_lens]

    class PatchEmbedding(nn.Module):  # 11.8.1
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

    class ViTMLP(nn.Module):  # 11.8.2
        def __init__(self, mlp_num_hiddens, mlp_num_outputs, dropout=0.5):
            super().__init__()
            self.dense1 = nn.LazyLinear(mlp_num_hiddens)
            self.gelu = nn.GELU()
            self.dropout1 = nn.Dropout(dropout)
            self.dense2 = nn.LazyLinear(mlp_num_outputs)
            self.dropout2 = nn.Dropout(dropout)

        def forward(self, x):
            return self.dropout2(self.dense2(self.dropout1(self.gelu(self.dense1(x)))))

    class ViTBlock(nn.Module):  # 11.8.3
        def __init__(self, num_hiddens, norm_shape, mlp_num_hiddens, num_heads, dropout, use_bias=False):
            super().__init__()
            self.ln1 = nn.LayerNorm(norm_shape)
            self.attention = MultiHeadAttention(num_hiddens, num_heads, dropout, use_bias)
            self.ln2 = nn.LayerNorm(norm_shape)
            self.mlp = ViTMLP(mlp_num_hiddens, num_hiddens, dropout)

        def forward(self, X, valid_lens=None):
            X = X + self.attention(*([self.ln1(X)] * 3), valid_lens)
            return X + self.mlp(self.ln2(X))

    class ViT(nn.Module):  # 11.8.4
        """Vision Transformer."""

        def __init__(
            self, img_size, patch_size, num_hiddens, mlp_num_hiddens, num_heads, num_blks, emb_dropout,
            blk_dropout, use_bias=False, num_classes=10,
        ):  # fmt: skip
            super().__init__()
            self.patch_embedding = PatchEmbedding(img_size, patch_size, num_hiddens)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, num_hiddens))
            num_steps = self.patch_embedding.num_patches + 1  # Add the cls token
            # Positional embeddings are learnable
            self.pos_embedding = nn.Parameter(torch.randn(1, num_steps, num_hiddens) * 0.02)
            self.dropout = nn.Dropout(emb_dropout)
            self.blks = nn.Sequential()
            for i in range(num_blks):
                self.blks.add_module(
                    f"{i}", ViTBlock(num_hiddens, num_hiddens, mlp_num_hiddens, num_heads, blk_dropout, use_bias)
                )
            self.head = nn.Sequential(nn.LayerNorm(num_hiddens), nn.Linear(num_hiddens, num_classes))

        def forward(self, X):
            X = self.patch_embedding(X)
            X = torch.cat((self.cls_token.expand(X.shape[0], -1, -1), X), 1)
            X = self.dropout(X + self.pos_embedding)
            for blk in self.blks:
                X = blk(X)
            return self.head(X[:, 0])

    class NWKernelRegression(nn.Module):  # 11.2.4
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.rand((1,), requires_grad=True))

        def forward(self, queries, keys, values):
            queries = queries.repeat_interleave(keys.shape[1]).reshape((-1, keys.shape[1]))
            self.attention_weights = F.softmax(-(((queries - keys) * self.w) ** 2) / 2, dim=1)
            return torch.bmm(self.attention_weights.unsqueeze(1), values.unsqueeze(-1)).reshape(-1)

    return dict(locals())


def translate(lib, encoder, decoder, src, tgt, valid_lens):
    """The book's ``EncoderDecoder.forward`` (10.6): encode, ``init_state``, decode with teacher
    forcing; the logits. ``lib`` is ``torch``-like (its ``tensor`` makes the inputs from arrays)
    or a function that does (``lambda a: a`` for inputs that are tensors already)."""
    tensor = getattr(lib, "tensor", lib)
    enc_outputs = encoder(tensor(src), tensor(valid_lens))
    state = decoder.init_state(enc_outputs, tensor(valid_lens))
    logits, _ = decoder(tensor(tgt), state)
    return logits

"""A small BERT-style transformer encoder for sequence classification.

Token and position embeddings are looked up with gathers, so their gradients
are sparse ``tf.IndexedSlices`` (only the rows used by the batch) - the case a
distributed optimizer has to handle differently from dense gradients. The
encoder is post-LayerNorm as in BERT: self-attention and a GELU feed-forward
network, each with a residual connection. Mean pooling over positions feeds a
dense classification head producing logits.

Example:
    >>> model = build_bert_small(vocab_size=50, seq_len=8, d_model=16, num_heads=2, num_layers=1)
    >>> model.output_shape
    (None, 2)
    >>> tokens, labels = synthetic_tokens(n=4, seq_len=8, vocab=50, num_classes=2, seed=0)
    >>> tokens.shape, labels.shape
    ((4, 8), (4,))
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops


class TokenAndPositionEmbedding(keras.layers.Layer):
    """Sum of a token embedding and a learned absolute position embedding.

    Example:
        >>> layer = TokenAndPositionEmbedding(vocab_size=10, seq_len=4, d_model=8)
        >>> tuple(layer(np.zeros((2, 4), dtype="int32")).shape)
        (2, 4, 8)
    """

    def __init__(self, vocab_size: int, seq_len: int, d_model: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.vocab_size, self.seq_len, self.d_model = vocab_size, seq_len, d_model
        init = keras.initializers.TruncatedNormal(stddev=0.02)  # BERT's initializer
        self.token = keras.layers.Embedding(vocab_size, d_model, embeddings_initializer=init, name="token_embedding")
        self.position = keras.layers.Embedding(seq_len, d_model, embeddings_initializer=init, name="position_embedding")

    def call(self, tokens):
        # A gather of positions (not adding the whole table) keeps this
        # gradient sparse too, and supports inputs shorter than seq_len.
        positions = ops.arange(ops.shape(tokens)[-1])
        return self.token(tokens) + self.position(positions)[None]

    def get_config(self) -> dict:
        return {**super().get_config(), "vocab_size": self.vocab_size, "seq_len": self.seq_len, "d_model": self.d_model}


def _encoder_layer(x: keras.KerasTensor, d_model: int, num_heads: int, ffn_dim: int, dropout: float) -> keras.KerasTensor:
    attn = keras.layers.MultiHeadAttention(num_heads, key_dim=d_model // num_heads, dropout=dropout)(x, x)
    x = keras.layers.LayerNormalization(epsilon=1e-12)(x + keras.layers.Dropout(dropout)(attn))
    h = keras.layers.Dense(ffn_dim, activation="gelu")(x)
    h = keras.layers.Dense(d_model)(h)
    return keras.layers.LayerNormalization(epsilon=1e-12)(x + keras.layers.Dropout(dropout)(h))


def build_bert_small(
    vocab_size: int = 8192,
    seq_len: int = 128,
    d_model: int = 256,
    num_heads: int = 4,
    num_layers: int = 4,
    num_classes: int = 2,
    ffn_dim: int | None = None,
    dropout: float = 0.1,
) -> keras.Model:
    """An uncompiled encoder classifier: int32 tokens [batch, seq_len] -> logits.

    ``ffn_dim`` defaults to 4 * d_model as in BERT. The defaults give about
    5 M parameters; tests use a tiny configuration.

    Example:
        >>> m = build_bert_small(vocab_size=100, seq_len=16, d_model=32, num_heads=4, num_layers=2, num_classes=3)
        >>> m.input_shape, m.output_shape
        ((None, 16), (None, 3))
    """
    if d_model % num_heads != 0:
        raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads})")
    ffn_dim = ffn_dim or 4 * d_model
    tokens = keras.Input(shape=(seq_len,), dtype="int32", name="tokens")
    x = TokenAndPositionEmbedding(vocab_size, seq_len, d_model, name="embeddings")(tokens)
    x = keras.layers.LayerNormalization(epsilon=1e-12)(x)
    x = keras.layers.Dropout(dropout)(x)
    for _ in range(num_layers):
        x = _encoder_layer(x, d_model, num_heads, ffn_dim, dropout)
    x = keras.layers.GlobalAveragePooling1D()(x)
    logits = keras.layers.Dense(num_classes)(x)
    return keras.Model(tokens, logits, name="bert_small")


def synthetic_tokens(n: int, seq_len: int, vocab: int, num_classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Learnable token sequences: int32 tokens [n, seq_len] and int32 labels [n].

    Token t belongs to group ``t % num_classes``; the label is the group with
    the most tokens in the sequence (ties -> lowest group). Half of each
    sequence is drawn from one random group so the majority is usually clear,
    and the label is then computed from the actual counts, so it is an exact
    function of the tokens.

    Example:
        >>> tokens, labels = synthetic_tokens(n=3, seq_len=6, vocab=20, num_classes=2, seed=0)
        >>> bool(((tokens >= 0) & (tokens < 20)).all()), sorted(set(labels.tolist())) <= [0, 1]
        (True, True)
    """
    if vocab < num_classes:
        raise ValueError(f"vocab ({vocab}) must be at least num_classes ({num_classes})")
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, size=(n, seq_len))
    favoured = rng.integers(0, num_classes, size=n)
    biased = rng.random((n, seq_len)) < 0.5
    # Move the biased positions onto a token of the favoured group (same
    # "row" of the vocabulary, wrapped to stay in range).
    shifted = tokens - tokens % num_classes + favoured[:, None]
    shifted = np.where(shifted >= vocab, shifted - num_classes, shifted)
    tokens = np.where(biased, shifted, tokens)
    counts = np.stack([(tokens % num_classes == c).sum(axis=1) for c in range(num_classes)], axis=1)
    return tokens.astype(np.int32), counts.argmax(axis=1).astype(np.int32)

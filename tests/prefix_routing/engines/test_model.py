"""The engine's tiny model (prefix_routing.engines.model): a Llama GGUF with a real tokenizer and a chat template."""

import gguf
import numpy as np

from prefix_routing.engines.model import CHAT_TEMPLATE, ModelShape, write_model


def _vocab(path):
    """A vocabulary-only GGUF like the ones llama.cpp ships (models/ggml-vocab-*.gguf)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"tok{i}" for i in range(61)])
    writer.add_token_scores([0.0] * 64)
    writer.add_token_types([2, 3, 3] + [1] * 61)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_model_has_the_shape_the_tokenizer_and_the_chat_template(tmp_path):
    shape = ModelShape(layers=2, hidden=64, ffn=128, heads=4, kv_heads=2, context=512, seed=7)
    path = write_model(tmp_path / shape.file_name(), _vocab(tmp_path / "vocab.gguf"), shape)
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file
    reader = gguf.GGUFReader(str(path))
    fields = {name: field.contents() for name, field in reader.fields.items()}
    assert fields["general.architecture"] == "llama" and fields["llama.block_count"] == 2
    assert fields["llama.embedding_length"] == 64 and fields["llama.attention.head_count_kv"] == 2
    assert fields["tokenizer.ggml.tokens"][:3] == ["<unk>", "<s>", "</s>"] and fields["tokenizer.chat_template"] == CHAT_TEMPLATE
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 9 * 2  # embeddings, output norm, output; nine per layer
    assert list(tensors["blk.0.attn_k.weight"].shape) == [64, 32]  # GGUF order: (in, out); kv = 64 / 4 * 2
    assert tensors["token_embd.weight"].tensor_type == gguf.GGMLQuantizationType.F16


def test_the_weights_are_the_same_for_a_seed_and_differ_for_another(tmp_path):
    vocab = _vocab(tmp_path / "vocab.gguf")
    small = dict(layers=1, hidden=32, ffn=64, heads=2, kv_heads=2, context=256)
    a = write_model(tmp_path / "a.gguf", vocab, ModelShape(**small, seed=1)).read_bytes()
    b = write_model(tmp_path / "b.gguf", vocab, ModelShape(**small, seed=1)).read_bytes()
    c = write_model(tmp_path / "c.gguf", vocab, ModelShape(**small, seed=2)).read_bytes()
    assert a == b and a != c
    data = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(tmp_path / "a.gguf")).tensors}
    assert 0.005 < float(np.abs(data["blk.0.attn_q.weight"].astype(np.float32)).mean()) < 0.05  # scale 0.02

"""neuron-support doctor, check `generation`: build the tiny random llama (and its word-level
tokenizer) that run.py then generates with, on CPU. Rerun by hand with: python3 @@FILE@@ out.json"""

import os

from harness import SPEC, main  # @@HARNESS@@

#: The words of the tiny tokenizer's vocabulary (every word of the prompt among them).
TEXT = (
    "once upon a time there was little girl who lived in village near the forest she liked to walk "
    "and sing with her friends one day found small bird on ground it could not fly so took home gave "
    "water bread next morning sun came up sky blue happy flew away came back every spring with song "
    "for old man said good night"
)


def check():
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = SPEC["out_dir"]
    vocab = {"<pad>": 0, "<unk>": 1}
    for word in TEXT.split():
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    # No EOS anywhere: random weights must not stop the generation before its tokens are counted.
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=None, eos_token_id=None)
    model.save_pretrained(out)
    return {"vocab": len(vocab), "files": sorted(os.listdir(out))}


if __name__ == "__main__":
    main(check)

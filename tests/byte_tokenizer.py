"""A 259-token byte-level tokenizer with a ChatML template, built in code: tests need no download."""


CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_byte_tokenizer(path, chat_template):
    """A 259-token byte-level BPE tokenizer (no merges) with ChatML special tokens, as an HF folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=core)
    hf.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                           "additional_special_tokens": ["<|im_start|>"]})
    if chat_template:
        hf.chat_template = chat_template
    hf.save_pretrained(str(path))
    return path

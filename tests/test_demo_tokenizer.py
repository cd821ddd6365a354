"""The demo tokenizer: character-level ids, special tokens, chat template, save/load round trip."""

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specroll.demo.tokenizer import build_tokenizer, encode_prompt


def test_text_round_trips_one_token_per_character():
    tokenizer = build_tokenizer()
    text = "7+8+0=15 5+6+1=12 >525"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text


def test_special_tokens_exist_and_are_skipped_when_decoding():
    tokenizer = build_tokenizer()
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    ids = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id}
    assert None not in ids and len(ids) == 4
    ids = tokenizer("12", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12"


def test_unknown_characters_become_unk():
    tokenizer = build_tokenizer()
    assert tokenizer("é", add_special_tokens=False)["input_ids"] == [tokenizer.unk_token_id]


def test_chat_template_renders_a_generation_prompt():
    tokenizer = build_tokenizer()
    messages = [{"role": "user", "content": "457+68"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == "<s><|user|>457+68<|assistant|>"
    ids = encode_prompt(tokenizer, messages)
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"


def test_chat_template_closes_assistant_turns_with_eos():
    tokenizer = build_tokenizer()
    messages = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "20 >2"}]
    assert tokenizer.apply_chat_template(messages, tokenize=False) == "<s><|user|>1+1<|assistant|>20 >2</s>"


def test_save_and_load_round_trip(tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    messages = [{"role": "user", "content": "99+1"}]
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert encode_prompt(loaded, messages) == encode_prompt(tokenizer, messages)
    assert loaded.eos_token_id == tokenizer.eos_token_id and loaded.pad_token_id == tokenizer.pad_token_id

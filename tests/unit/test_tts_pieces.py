"""How the TTS stages cut a reply into pieces: the first phrase early, then
sentences and clauses (``first_piece`` / ``next_piece``)."""

from vllm_duplex.stages.speech.pieces import first_piece, next_piece


def test_first_piece_is_the_first_few_words_not_the_sentence():
    text = "The capital of France is Paris. "
    assert next_piece(text[:20], 4) == 0  # the old cut waited for the sentence
    assert first_piece("The capital of", 4, 4) == 0  # three words: not yet
    assert first_piece("The capital of France", 4, 4) == 0  # the fourth is not complete yet
    assert first_piece("The capital of France is", 4, 4) == len("The capital of France ")


def test_first_piece_stops_at_an_earlier_clause_mark_or_sentence_end():
    assert first_piece("Sure, the capital", 4, 4) == 0  # one word before the comma: too short
    assert first_piece("Well sure, the capital", 4, 4) == len("Well sure, ")
    assert first_piece("Yes. Paris is the", 4, 4) == len("Yes. ")
    assert first_piece("Hi there", 4, 4, final=True) == len("Hi there")


def test_first_words_zero_keeps_the_sentence_cut():
    assert first_piece("The capital of France is", 0, 12) == 0
    assert first_piece("The capital of France is Paris. And", 0, 12) == len(
        "The capital of France is Paris. ")

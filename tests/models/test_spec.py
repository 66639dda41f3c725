"""Layer and attention specifications: fairseq's string form, the YAML forms, and bad input."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from convseq.models.config import FConvConfig, ModelConfigError, as_fconv_config
from convseq.models.spec import SpecError, parse_attention, parse_layers, receptive_field


def test_fairseq_string_forms():
    assert parse_layers("[(512, 3)] * 2") == ((512, 3, 1), (512, 3, 1))
    # fconv_wmt_en_de's spec, as fairseq writes it
    got = parse_layers("[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2")
    assert len(got) == 15
    assert got[8] == (512, 3, 1) and got[9] == (1024, 3, 1) and got[13] == (2048, 1, 1)
    # 3-tuples, a tuple-of-tuples default as in fairseq's signatures, int * list
    assert parse_layers("[(850, 6, 0)] + 2 * [(850, 1)]") == (
        (850, 6, 0),
        (850, 1, 1),
        (850, 1, 1),
    )
    assert parse_layers("((256, 3),) * 3") == ((256, 3, 1),) * 3
    assert parse_layers(" [(8, 3)] ") == ((8, 3, 1),)


def test_yaml_list_forms_and_repeat():
    yaml = """
    layers:
      - {layer: [512, 3], repeat: 2}
      - [1024, 3]
      - [2048, 1, 2]
    """
    node = OmegaConf.create(yaml).layers  # a ListConfig, as Hydra passes it (P14)
    assert parse_layers(node) == ((512, 3, 1), (512, 3, 1), (1024, 3, 1), (2048, 1, 2))
    assert parse_layers([[4, 3], (5, 2, 0)]) == ((4, 3, 1), (5, 2, 0))


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("__import__('os').system('true')", "Call is not allowed"),
        ("[(512, 3)] * 10**9", "not allowed"),  # ** is refused before anything is built
        ("[(512, 3)] * 100000", "repeat count"),
        ("[(512, 3.5)]", "only integers"),
        ("[(512, 3)", "syntax error"),
        ("[(512,)]", "expected [channels, kernel]"),
        ("[(True, 3)]", "must be integers"),
        ("[(0, 3)]", ">= 1"),
        ("[(8, 3, 2)]", "residual must lie in 0..1"),
        ("[]", "has no layers"),
        ("[(8, 3)] + 5", "'+' joins two lists"),
    ],
)
def test_bad_string_specs_are_refused_by_name(spec, needle):
    with pytest.raises(SpecError) as err:
        parse_layers(spec, "decoder_layers")
    message = str(err.value)
    assert "model.decoder_layers" in message and needle in message


def test_bad_yaml_items_are_refused():
    with pytest.raises(SpecError, match="repeat item"):
        parse_layers([{"layer": [8, 3], "times": 2}], "encoder_layers")
    with pytest.raises(SpecError, match="repeat must be an integer"):
        parse_layers([{"layer": [8, 3], "repeat": "2"}], "encoder_layers")
    with pytest.raises(SpecError, match="layer 1"):
        parse_layers([[8, 3], [8, 3, 1, 1]], "encoder_layers")
    with pytest.raises(SpecError, match="expected a list"):
        parse_layers(512, "encoder_layers")


def test_attention_forms():
    assert parse_attention(True, 3) == (True, True, True)
    assert parse_attention("False", 2) == (False, False)
    assert parse_attention("true", 2) == (True, True)
    assert parse_attention("[True, False, True]", 3) == (True, False, True)
    assert parse_attention(OmegaConf.create([False, True]), 2) == (False, True)
    with pytest.raises(SpecError, match="3 entries for 2 decoder layers"):
        parse_attention([True, True, True], 2)
    with pytest.raises(SpecError, match="list of bools"):
        parse_attention([1, 0], 2)


def test_receptive_field_of_fairseq_presets():
    # reference section 1.1: iwslt decoder 7 tokens, encoder 9; wmt_en_de 27 on each side
    assert receptive_field(parse_layers("[(256, 3)] * 3")) == 7
    assert receptive_field(parse_layers("[(256, 3)] * 4")) == 9
    assert receptive_field(parse_layers("[(512,3)]*9 + [(1024,3)]*4 + [(2048,1)]*2")) == 27


def test_config_from_dict_dictconfig_and_unknown_keys():
    assert as_fconv_config({"dropout": 0.3}).dropout == 0.3
    assert as_fconv_config({}).encoder_layers == "[(512, 3)] * 20"  # fairseq's base default
    node = OmegaConf.structured(FConvConfig(arch="x"))
    assert as_fconv_config(node).arch == "x"
    with pytest.raises(ModelConfigError, match="encoder_layer"):
        as_fconv_config({"encoder_layer": "[(8, 3)]"})

import pytest

from artmlx.config import FIELDS, TrainConfig, config_to_toml, field_docs, load_config, parse_override


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"group_size": 1}, "group_size"),
        ({"learning_rate": -1.0}, "learning_rate"),
        ({"learning_rate": "fast"}, "learning_rate"),
        ({"objective": "dpo"}, "objective"),
        ({"normalization": "sum"}, "normalization"),
        ({"eps_low": 1.5}, "eps_low"),
        ({"lora_dropout": 1.0}, "lora_dropout"),
        ({"adam_betas": [0.9]}, "adam_betas"),
        ({"steps": 0}, "steps"),
        ({"minibatches": 99}, "minibatches"),
        ({"temperature": True}, "temperature"),
    ],
)
def test_bad_values_name_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        load_config(None, overrides)


def test_unknown_fields_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown config field"):
        load_config(None, {"learnig_rate": 1e-3})
    path = tmp_path / "run.toml"
    path.write_text("group_size = 4\nbogus = 1\n")
    with pytest.raises(ValueError, match="bogus"):
        load_config(path)
    path.write_text("group_size = \n")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_config(path)


def test_file_then_overrides_and_round_trip(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('group_size = 4\nenv_args = {opponent = "perfect"}\nlearning_rate = 1\n')
    config = load_config(path, {"group_size": 6, "steps": None})
    assert config.group_size == 6 and config.env_args == {"opponent": "perfect"}
    assert isinstance(config.learning_rate, float)
    again = tmp_path / "again.toml"
    again.write_text(config_to_toml(config))
    assert load_config(again) == config


def test_overrides_parse_toml_values():
    assert parse_override("eps_high=0.3") == ("eps_high", 0.3)
    assert parse_override("env=arithmetic") == ("env", "arithmetic")
    assert parse_override("lora_keys=['self_attn.q_proj']") == ("lora_keys", ["self_attn.q_proj"])
    with pytest.raises(ValueError, match="key=value"):
        parse_override("eps_high")


def test_every_field_is_documented():
    docs = field_docs()
    assert set(docs) == set(FIELDS)
    assert all(len(text) > 10 for text in docs.values())


def test_actor_window_shares_one_update_between_the_actors():
    config = TrainConfig(groups_per_step=16, actor_groups_per_batch=4)
    assert config.resolved_max_in_flight() == 20
    assert config.resolved_max_in_flight(2) == 12
    assert config.resolved_max_in_flight(3) == 10  # ceil(16 / 3) + 4
    assert TrainConfig(max_in_flight=5).resolved_max_in_flight(4) == 5


def test_actor_window_follows_the_batch_each_actor_reports():
    """With automatic batches (the default) the window is the share plus the actor's own batch."""
    config = TrainConfig(groups_per_step=16)
    assert config.share_of_update(1) == 16 and config.share_of_update(3) == 6
    assert config.resolved_max_in_flight(1) == 32  # nothing reported yet: a batch of one share
    assert config.resolved_max_in_flight(2, groups_per_batch=5) == 13
    assert TrainConfig(actor_groups_per_batch=4).resolved_max_in_flight(2, groups_per_batch=5) == 12  # fixed wins


@pytest.mark.parametrize("settings, words", [
    ({"dora": True, "kl_coef": 0.1}, "trained magnitude"),
    ({"compile_step": True, "lora_dropout": 0.1}, "one dropout mask"),
])
def test_combinations_that_would_train_wrongly_are_refused(settings, words):
    with pytest.raises(ValueError, match=words):
        load_config(None, settings)

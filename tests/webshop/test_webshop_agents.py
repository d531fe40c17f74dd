"""WebShop scripted vs random agent on the offline catalogue's test goals, and step latency."""
import pytest

from envs.webshop import WebShopConfig, WebShopEnv
from envs.webshop.agents import evaluate, main, parse_instruction, step_latency


@pytest.fixture(scope="module")
def env():
    return WebShopEnv(WebShopConfig())


def test_parse_instruction():
    text = ("Find me slim fit men's dress shirts with button closure with color: black | white, and size: large, "
            "and price lower than 40.00 dollars")
    assert parse_instruction(text) == ("slim fit men's dress shirts with button closure",
                                       {"color": "black | white", "size": "large"}, 40.0)
    assert parse_instruction("Find me lamps") == ("lamps", {}, float("inf"))


@pytest.mark.slow
def test_scripted_agent_beats_random_agent(env):
    tasks = env.tasks("test")
    scripted = evaluate(env, tasks, "scripted")
    random_agent = evaluate(env, tasks, "random", seed=0)
    print(f"scripted: {scripted}\nrandom: {random_agent}")
    assert scripted["episodes"] == 500
    assert scripted["success_rate"] > 60.0 and scripted["score"] > 80.0  # a clear majority of test goals
    assert random_agent["success_rate"] < 10.0 and random_agent["score"] < scripted["score"] / 2


def test_step_latency_under_5ms(env):
    latency = step_latency(env, env.tasks("test")[:100])
    print(latency)
    assert latency["search_ms"] < 5.0 and latency["click_ms"] < 5.0


def test_cli_prints_numbers(capsys):
    assert main(["--goals", "20", "--num-products", "300"]) == 0
    out = capsys.readouterr().out
    assert "scripted agent on 20 test goals" in out and "median latency" in out

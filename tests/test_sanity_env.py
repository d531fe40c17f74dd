"""The sanity environment (envs/sanity.py): rules, rewards, splits, difficulty levels, prompts. Fast, no model."""
import pytest

from envs.base import STEP_INFO_KEYS, Task
from envs.sanity import FAMILIES, GARDEN, LAB, OVER, PICK_WORD, SanityConfig, SanityEnv, stage_rewards


def make(**overrides) -> SanityEnv:
    return SanityEnv(SanityConfig(**{"families": list(FAMILIES), **overrides}))


def play(env: SanityEnv, task: Task, actions: list[str]):
    env.reset(task)
    rewards, infos, obs, done = [], [], "", False
    for action in actions:
        obs, reward, done, info = env.step(action)
        rewards.append(reward)
        infos.append(info)
        if done:
            break
    return obs, rewards, done, infos


def first(env: SanityEnv, family: str, split: str = "train") -> Task:
    return next(t for t in env.tasks(split) if t.name == family)


def commands_of(env: SanityEnv, task: Task) -> list[str]:
    env.reset(task)
    return env.commands()


@pytest.mark.parametrize("difficulty", [0, 1, 2])
@pytest.mark.parametrize("num_stages", [3, 4])
def test_gold_path_of_every_family_scores_100(difficulty, num_stages):
    env = make(difficulty=difficulty, num_stages=num_stages, train_variations=4, test_variations=2)
    for task in env.tasks("train") + env.tasks("test"):
        gold = env.gold_actions(task)
        assert len(gold) == (1 if task.name == "pick" else num_stages)
        obs, rewards, done, infos = play(env, task, gold)
        assert done and len(rewards) == len(gold), (task, obs)
        assert sum(rewards) == infos[-1]["score"] == 100 and infos[-1]["success"] and not infos[-1]["truncated"]
        assert all(set(STEP_INFO_KEYS) <= set(info) for info in infos)
        assert [info["action"] for info in infos] == gold and obs.endswith(OVER)
        assert all(info["score"] < 100 and not info["success"] for info in infos[:-1])


def test_stage_rewards_sum_to_100():
    assert stage_rewards(3) == [33, 33, 34] and stage_rewards(1) == [100]
    assert all(sum(stage_rewards(n)) == 100 for n in range(1, 5))


@pytest.mark.parametrize("family, fatal", [("lab", LAB.fatal), ("garden", GARDEN.fatal)])
def test_fatal_command_ends_at_minus_100(family, fatal):
    env = make()
    task = first(env, family)
    _, rewards, done, infos = play(env, task, env.gold_actions(task)[:1] + [fatal, "look around"])
    assert done and len(rewards) == 2 and rewards == [33.0, -133.0]
    assert infos[-1]["score"] == -100 and sum(rewards) == -100 and not infos[-1]["success"]
    assert env.step("look around") == (OVER, 0.0, True, dict(infos[-1], action=""))  # nothing changes afterwards


def test_focusing_on_a_wrong_object_is_fatal_unless_fatal_is_off():
    env = make()
    task = first(env, "lab")
    wrong = next(c for c in commands_of(env, task) if c.startswith("focus on") and c != env.gold_actions(task)[-1])
    _, rewards, done, infos = play(env, task, [wrong])
    assert done and rewards == [-100.0] and infos[-1]["score"] == -100
    safe = make(fatal=False)
    safe.reset(task)
    assert LAB.fatal not in safe.commands()
    _, rewards, done, _ = play(safe, task, [wrong])
    assert not done and rewards == [0.0]


def test_truncation_at_max_steps():
    env = make(max_steps=4)
    obs, rewards, done, infos = play(env, first(env, "lab"), ["look around"] * 10)
    assert done and len(rewards) == 4 and infos[-1]["truncated"] and not infos[-1]["success"]
    assert [i["truncated"] for i in infos] == [False, False, False, True] and obs.endswith(OVER)


def test_action_correction_maps_near_misses_and_survives_garbage():
    env = make()
    task = first(env, "lab")
    gold = env.gold_actions(task)
    env.reset(task)
    near = gold[0].replace("the ", "").upper() + ".\nAnd then I would press the button."
    obs, reward, _, info = env.step(near)
    assert info["action"] == gold[0] and info["corrected"] and reward == 33
    for garbage in ["", None, "   \n\n", "☃ \u200b ünïcödé", "x" * 100_000, 12345, "Action: 'press the'"]:
        env.reset(task)
        obs, reward, done, info = env.step(garbage)
        assert info["action"] in env.commands() and isinstance(obs, str) and -100 <= info["score"] <= 100
    env.reset(task)
    assert env.step("")[3]["action"] == env.commands()[0]  # all similarities 0: the first listed command


def test_without_correction_an_unknown_command_is_a_no_op():
    env = make(action_correction=False)
    env.reset(first(env, "lab"))
    obs, reward, done, info = env.step("dance wildly")
    assert (reward, done, info["action"], info["corrected"]) == (0.0, False, "dance wildly", False)
    assert obs.startswith("Unknown command") and "Available commands:" in obs


def test_splits_are_disjoint_and_deterministic():
    a, b = make(), make()
    assert a.tasks("train") == b.tasks("train") and a.tasks("test") == b.tasks("test")
    for family in FAMILIES:
        train = [t for t in a.tasks("train") if t.name == family]
        test = [t for t in a.tasks("test") if t.name == family]
        assert len(train) == 32 and len(test) == 8 and not set(train) & set(test)
        contents = {t: (tuple(a.gold_actions(t)), frozenset(commands_of(a, t))) for t in train + test}
        assert len(set(contents.values())) == len(contents)  # no two variations are the same task
        assert all(a.reset(t) == b.reset(t) for t in train + test)
    assert make(seed=1).reset(Task("lab", 0)) != a.reset(Task("lab", 0))
    assert make(train_variations=5).tasks("test") == a.tasks("test")  # the test split ignores the train size
    with pytest.raises(ValueError):
        a.tasks("dev")


def test_variations_need_different_commands():
    env = make(difficulty=1)
    golds = {tuple(env.gold_actions(t)) for t in env.tasks("train") if t.name == "lab"}
    assert len(golds) >= 6  # one solution per target colour
    for family in ("lab", "garden"):
        tasks = [t for t in env.tasks("train") if t.name == family]
        assert len({env.gold_actions(t)[0] for t in tasks}) >= 6


def test_difficulty_levels():
    stages = {d: make(difficulty=d, num_stages=4) for d in (0, 1, 2)}
    for d, env in stages.items():
        task = first(env, "lab")
        text, gold = env.reset(task), env.gold_actions(task)
        assert ("Use these commands, in this order: " + ", ".join(gold) in text) == (d == 0)
        assert all(g in text for g in gold)  # always listed among the available commands
    # 0 and 1: every variation follows the family's fixed order (open, connect, press, focus)
    for d in (0, 1):
        verbs = {tuple(g.split()[0] for g in stages[d].gold_actions(t)) for t in stages[d].tasks("train")
                 if t.name == "lab"}
        assert verbs == {("open", "connect", "press", "focus")}
    # 2: the order before the focus differs between variations; a wrong order names the missing stage
    env = stages[2]
    tasks = [t for t in env.tasks("train") if t.name == "lab"]
    assert len({tuple(g.split()[0] for g in env.gold_actions(t)) for t in tasks}) >= 3
    task = tasks[0]
    gold = env.gold_actions(task)
    env.reset(task)
    obs, reward, done, _ = env.step(gold[1])
    needed = next(s for s in LAB.prep if s.command.format(k=gold[0].split()[2]) == gold[0])
    assert reward == 0 and not done and obs.startswith("That does not work yet: " + needed.todo.format(
        k=gold[0].split()[2]))
    look = env.step("look around")[0]
    assert "Now the" in look and look.index("panel is") < look.index("wire is")  # fixed order: no hint


def test_difficulty_2_needs_two_stages_to_order():
    with pytest.raises(ValueError, match="env.sanity.num_stages"):
        make(difficulty=2, num_stages=2)
    make(difficulty=2, num_stages=2, families=["pick"])  # pick has no stages


def test_window_prompt_shows_the_last_k_steps():
    env = make()
    task = first(env, "lab")
    first_message = env.reset(task)
    assert env.window_prompt(2) == first_message
    for action in ["look around", "dance", "sing"]:
        env.step(action)
    prompt = env.window_prompt(1)
    assert prompt.startswith(first_message) and "Your most recent 1 of 3 actions" in prompt
    assert "Action: sing" in prompt and "Action: dance" not in prompt
    assert prompt.endswith(env.history[-1][1].strip())
    assert "Action: dance" in env.window_prompt(2) and "Action: look around" not in env.window_prompt(2)
    assert "Action:" not in env.window_prompt(0)[len(first_message):]


def test_pick_pays_exactly_one_command():
    env = make(pick_choices=5)
    for task in [t for t in env.tasks("train") + env.tasks("test") if t.name == "pick"][:10]:
        env.reset(task)
        commands = env.commands()
        assert len(commands) == 5 and PICK_WORD in commands
        paid = []
        for command in commands:
            _, rewards, done, infos = play(env, task, [command])
            assert done and len(rewards) == 1 and not infos[0]["truncated"]
            paid += [command] if rewards[0] == 100 and infos[0]["success"] else []
            assert rewards[0] in (0, 100)
        assert paid == [PICK_WORD]
    orders = {tuple(commands_of(env, t)) for t in env.tasks("train") if t.name == "pick"}
    assert len({o.index(PICK_WORD) for o in orders}) > 1  # the paying word moves around the list


def test_pick_tries_the_first_listed_word_the_answer_says():
    env = make(pick_choices=4)
    task = [t for t in env.tasks("train") if t.name == "pick"][0]
    other = [c for c in commands_of(env, task) if c != PICK_WORD][0]
    for answer, action, reward in [('The password is "dax".', PICK_WORD, 100.0), (f"{other}, or dax?", other, 0.0),
                                   ("I am not sure.", "", 0.0), ("", "", 0.0)]:
        env.reset(task)
        _, r, done, info = env.step(answer)
        assert (info["action"], r, done) == (action, reward, True), answer


def test_first_messages_stay_short():
    env = make(num_stages=4, num_distractors=2, difficulty=0)
    for task in env.tasks("train") + env.tasks("test"):
        text = env.reset(task)
        assert len(text) <= (300 if task.name == "pick" else 1000), (task, len(text))
        assert text.endswith("Respond with exactly one command from the list, no other words.")
        assert "Available commands: " in text


def test_every_observation_ends_with_the_command_list():
    env = make()
    task = first(env, "garden")
    env.reset(task)
    listed = "Available commands: " + ", ".join(env.commands()) + "."
    harmless = next(c for c in env.commands() if c.split()[0] in ("plant", "water") and c not in env.gold_actions(task))
    for action in ["look around", harmless, harmless] + env.gold_actions(task)[:-1]:
        obs, _, done, _ = env.step(action)
        assert not done and obs.endswith(listed)


@pytest.mark.parametrize("field, value", [("families", ["kitchen"]), ("families", []), ("difficulty", 3),
                                          ("num_stages", 5), ("max_steps", 9), ("pick_choices", 1),
                                          ("num_distractors", 8), ("train_variations", 10**5)])
def test_bad_settings_name_their_key(field, value):
    with pytest.raises(ValueError, match=f"env.sanity.{field}"):
        SanityEnv(SanityConfig(**{field: value}))


def test_reset_checks_the_variation():
    env = make()
    with pytest.raises(ValueError):
        env.reset(Task("lab", 10**6))
    with pytest.raises(ValueError):
        env.reset(Task("kitchen", 0))
    with pytest.raises(RuntimeError):
        SanityEnv().step("look around")


def test_oracle_tips_say_only_what_the_episode_revealed():
    """rollout.tip_source=environment: hand-written expected tips for lab variation 0 at difficulty 2, whose
    hidden order is press the green button, connect the green wire, focus on the green lamp."""
    env = make(families=["lab"], difficulty=2, num_stages=3, num_distractors=1, max_steps=4, train_variations=16,
               test_variations=8)
    task = Task("lab", 0)
    play(env, task, ["look around", "press the blue button", "look around", "look around"])
    assert env.oracle_tip() == ""  # nothing about the task was revealed
    play(env, task, ["connect the green wire", "look around", "look around", "look around"])
    assert env.oracle_tip() == "The next step needed is: press the green button."
    play(env, task, ["press the green button", "focus on the green lamp", "touch the bare wire"])
    assert env.oracle_tip() == ("These steps worked, in this order: press the green button. The next step needed is: "
                                "connect the green wire. Never touch the bare wire: it fails the task.")
    play(env, task, ["press the green button", "focus on the blue lamp"])
    assert env.oracle_tip() == ("These steps worked, in this order: press the green button. "
                                "Never focus on the blue lamp: it fails the task.")
    play(env, task, ["press the green button", "connect the green wire", "focus on the green lamp"])
    assert env.oracle_tip() == ("This solved the task, in this order: press the green button, connect the green wire, "
                                "focus on the green lamp.")
    pick = make(families=["pick"])
    wrong = next(w for w in commands_of(pick, first(pick, "pick")) if w != PICK_WORD)
    play(pick, first(pick, "pick"), [wrong])
    assert pick.oracle_tip() == f"The password is not {wrong}."
    play(pick, first(pick, "pick"), ["hello"])  # no listed word: nothing was tried
    assert pick.oracle_tip() == ""
    play(pick, first(pick, "pick"), [PICK_WORD])
    assert pick.oracle_tip() == "The password is dax."


# ----------------------------------------------------------------------------- the hard-exploration lab


def switch_lab(**overrides) -> SanityEnv:
    return SanityEnv(SanityConfig(**{"families": ["lab", "garden"], "switch": True, "reward": "success",
                                     "num_distractors": 1, "max_steps": 4, **overrides}))


def first_line(observation: str) -> str:
    return observation.split("\n")[0]


def test_the_switch_lab_by_hand():
    """env.sanity.switch: "flip the main switch" (listed once, no colour) between the wire and the button; only a
    premature press or focus reveals it; look around never does; reward "success": 0 per stage, 100 at the end."""
    env = switch_lab()
    task = first(env, "lab")
    gold = env.gold_actions(task)
    colour = gold[0].split()[2]
    assert gold == [f"connect the {colour} wire", "flip the main switch", f"press the {colour} button",
                    f"focus on the {colour} lamp"]
    env.reset(task)
    assert env.commands().count("flip the main switch") == 1 and len(env.commands()) == 9  # 1 + 2 x 3 + fatal + switch
    obs, rewards, done, infos = play(env, task, gold)
    assert rewards == [0.0, 0.0, 0.0, 100.0] and done and infos[-1]["success"] and infos[-1]["score"] == 100
    assert [first_line(o) for o in (obs,)] == [f"You focus on the {colour} lamp. It shines: task complete. {OVER}"]

    env.reset(task)
    steps = [env.step(a) for a in (f"connect the {colour} wire", f"press the {colour} button",
                                   f"focus on the {colour} lamp", "look around")]
    assert [first_line(o) for o, *_ in steps] == [
        f"You connect the {colour} wire.",
        "That does not work yet: the main switch is off.",
        "That does not work yet: the main switch is off.",
        first_line(env.first_message) + f" Now the {colour} wire is connected, the {colour} button is not pressed. "
                                        f"You are out of steps. {OVER}"]
    assert [r for _, r, *_ in steps] == [0.0] * 4 and steps[-1][2] and steps[-1][3]["truncated"]
    assert "switch" not in steps[-1][0].split("\n")[0]  # look around: the switch's state is never shown

    env.reset(task)
    assert first_line(env.step("flip the main switch")[0]) == f"That does not work yet: the {colour} wire is loose."
    assert first_line(env.step(f"connect the {colour} wire")[0]) == f"You connect the {colour} wire."
    assert first_line(env.step("flip the main switch")[0]) == "You flip the main switch."
    again = first_line(env.step("flip the main switch")[0])
    assert again == f"Nothing happens: the main switch is on. You are out of steps. {OVER}"


def test_the_switch_is_the_labs_only_and_stages_can_still_pay():
    env = switch_lab()
    garden = first(env, "garden")
    assert "flip the main switch" not in commands_of(env, garden) and len(env.gold_actions(garden)) == 3
    staged = switch_lab(reward="stages", num_stages=4, max_steps=6)
    task = first(staged, "lab")
    _, rewards, done, infos = play(staged, task, staged.gold_actions(task))
    assert staged.gold_actions(task)[2] == "flip the main switch"  # open, connect, flip, press, focus
    assert rewards == [20.0, 20.0, 20.0, 20.0, 20.0] and infos[-1]["success"]
    plain = SanityEnv(SanityConfig(families=["lab"]))  # off by default: the lab as before
    assert "flip the main switch" not in commands_of(plain, first(plain, "lab"))


@pytest.mark.parametrize("settings, message", [
    (dict(families=["garden"]), "env.sanity.switch"), (dict(difficulty=2), "env.sanity.switch"),
    (dict(num_stages=2), "env.sanity.switch"), (dict(reward="score"), "env.sanity.reward")])
def test_the_switch_lab_refuses_other_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        switch_lab(**settings)


def test_oracle_entries_name_the_command_needed_at_each_state_by_hand():
    """rollout.tip_source=oracle: a premature command stores, at the state it was tried in, the missing command; a
    success stores every state's next gold command; an episode that revealed nothing stores nothing. Each tip
    quotes its command and no other."""
    env = switch_lab()
    task = first(env, "lab")
    connect, flip, press, focus = env.gold_actions(task)
    tip = 'The command to play now is "{}".'.format
    start = env.reset(task)
    after_connect = env.step(connect)[0]
    refused = env.step(press)[0]  # too early: the switch is revealed at the state it was tried in
    env.step(press)  # again, from the refusal's observation: another state, another entry
    env.step(press)  # the same state again: no new entry
    assert env.oracle_entries() == [(after_connect, tip(flip)), (refused, tip(flip))]
    env.reset(task)
    for action in ("look around", connect, "look around", "look around"):
        env.step(action)
    assert env.oracle_entries() == []  # nothing revealed, no success
    states = [env.reset(task)] + [env.step(a)[0] for a in (connect, flip, press)]
    env.step(focus)
    assert env.oracle_entries() == [(states[0], tip(connect)), (states[1], tip(flip)), (states[2], tip(press)),
                                    (states[3], tip(focus))]
    assert states[0] == start and states[1] == after_connect
    assert all(text.count('"') == 2 for _, text in env.oracle_entries())  # one quoted command per tip

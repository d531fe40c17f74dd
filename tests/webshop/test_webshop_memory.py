"""The tip memory on real WebShop goals: a family slot shows a goal the tips of the closest goals first, each
return out of the reward's own scale (memory.py, docs/webshop.md "Memory key")."""
from envs.webshop import WebShopConfig, WebShopEnv
from envs.webshop.agents import scripted_episode
from memory import TipMemory
from memory import tip_entries
from rollout import Episode


def act(action: str) -> str:
    return f"<think>reasoning</think>\n<action>{action}</action>"


class Recorder(WebShopEnv):
    """The real environment, recording its episode as run_episodes does: the observation before each action, the
    action, the reward."""

    def reset(self, task):
        self.episode = Episode(task=task, group=0, mode="no_memory")
        self.observation = super().reset(task)
        return self.observation

    def step(self, action):
        self.episode.observations.append(self.observation)
        self.episode.actions.append(action)
        self.observation, reward, done, info = super().step(action)
        self.episode.rewards.append(reward)
        return self.observation, reward, done, info


def test_a_family_slot_shows_the_same_product_types_tips_first_on_the_rewards_scale():
    env = Recorder(WebShopConfig(reward_mode="success"))
    goals, tasks = env.world.goals, env.tasks("train")
    kind = goals[tasks[0].variation]["query"]
    played, current = [t for t in tasks if goals[t.variation]["query"] == kind][:2]
    env.reset(played)  # a search that buys nothing: return 0
    env.step(act(f"search[{kind}]"))
    unsolved = env.episode
    unsolved.tip = f"Search for {kind} by name first."
    other = next(t for t in tasks[1:] if goals[t.variation]["query"] != kind and scripted_episode(env, t)["success"])
    solved = env.episode  # another product type, bought perfectly: return 10
    solved.tip = "Choose every option before buying."
    assert (unsolved.extrinsic_return, solved.extrinsic_return) == (0.0, 10.0)

    memory = TipMemory(top_k=100, key_by="family")
    for ep in (unsolved, solved):
        for entry in tip_entries(ep, env.max_score()):
            memory.stage(ep.task.key, entry)
    memory.sync()
    first_message = env.reset(current)
    shown = memory.retrieve(current.key, first_message, first_message)
    # the same product type first, although it scored lower (a step repeated within an episode is one entry)
    assert [e.tip for e in shown] == [unsolved.tip] + [solved.tip] * (len(shown) - 1) and len(shown) > 2
    assert goals[played.variation]["instruction_text"] in shown[0].goal and other.key != current.key
    assert shown[0].render().endswith("Eventually you got the score 0.0/10.")
    assert shown[-1].render().endswith("Eventually you got the score 10.0/10.")
    assert memory.retrieve(current.key, first_message)[0].tip == solved.tip  # without the goal: the return decides

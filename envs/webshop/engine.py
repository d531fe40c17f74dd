"""The WebShop page machine: per-episode state, actions, [SEP] text observations, clickables.

Maps to docs/webshop.md:
  §2.1  pages and transitions (search -> results -> item -> description/features/reviews -> done),
        top-50 results shown 10 per page, options recorded per group and cleared whenever the
        results or search page is shown again, "< prev" semantics per page;
  §2.2  actions `search[...]` / `click[...]` parsed with the regex (.+)\\[(.+)\\], argument
        lower-cased; `click[x]` legal only if x is a current clickable; `click[search]` rejected;
        an illegal action is a no-op (reward 0, not done, page unchanged, no error text);
  §2.3  text observation: the page's visible text segments joined with " [SEP] ";
        `available_actions()` = {"has_search_bar", "clickables"}.

Choices: `search[...]` is executed from every page, as the original text env does (the constructor's
`search_from_any_page=False` restricts it to the search page; tests only); the admissible-action list
offers it only on the search page, like WebShop, and lists every clickable in page order
(`click[search]` included, as verl-agent does).
Item pages of out-of-range result pages (`next >` past the last hit) are empty, as in
WebShop. The "done" page wording is ours (WebShop shows an MTurk summary); it states the score.
The engine reward is the task reward in [0, 1]; env.py maps it to the training reward.
"""
from __future__ import annotations

import re

from .reward import get_reward
from .world import World

PRODUCT_WINDOW = 10
SEARCH, RESULTS, ITEM, SUB, DONE = "search", "results", "item", "item_sub", "done"
BACK, NEXT, PREV, BUY = "back to search", "next >", "< prev", "buy now"
SUB_PAGES = ("description", "features", "reviews")
SEP = " [SEP] "
_ACTION = re.compile(r"(.+)\[(.+)\]", re.DOTALL)


def parse_action(action: str) -> tuple[str, str] | None:
    """'click[Buy Now]' -> ('click', 'buy now'); None when the grammar does not match. As the original (and
    verl-agent, which strips and lower-cases the whole action), nothing inside is stripped: `click[ buy now]` names
    no button and `click [buy now]` no verb."""
    match = _ACTION.match(action.strip()) if isinstance(action, str) else None
    if match is None:
        return None
    return match.group(1).lower(), match.group(2).lower()


class WebShopEngine:
    """One shopper's episode over a shared `World`."""

    def __init__(self, world: World, search_from_any_page: bool = True):
        self.world = world
        self.search_from_any_page = search_from_any_page
        self.goal: dict | None = None
        self.goal_index = -1
        self._clear_episode()

    # ------------------------------------------------------------------ state

    def _clear_episode(self) -> None:
        self.page = SEARCH
        self.keywords = ""
        self.results: list[str] = []
        self.page_num = 1
        self.asin: str | None = None
        self.options: dict[str, str] = {}
        self.sub_page = ""
        self.reward = 0.0
        self.reward_info: dict = {}

    def reset(self, goal_index: int) -> str:
        if not 0 <= goal_index < len(self.world.goals):
            raise IndexError(f"goal index {goal_index} out of range [0, {len(self.world.goals)})")
        self.goal_index = goal_index
        self.goal = self.world.goals[goal_index]
        self._clear_episode()
        return self.observation()

    @property
    def done(self) -> bool:
        return self.page == DONE

    @property
    def instruction(self) -> str:
        return self.goal["instruction_text"] if self.goal else ""

    @property
    def product(self) -> dict | None:
        return self.world.by_asin.get(self.asin) if self.asin else None

    def page_results(self) -> list[dict]:
        start = (self.page_num - 1) * PRODUCT_WINDOW
        return [self.world.by_asin[a] for a in self.results[start:start + PRODUCT_WINDOW]]

    # ------------------------------------------------------------------ actions

    def available_actions(self) -> dict:
        if self.page == SEARCH:
            return {"has_search_bar": True, "clickables": ["search"]}
        if self.page == RESULTS:
            # page order, as the original collects them: Back to Search, < Prev (page > 1), Next >
            clickables = [BACK] + ([PREV] if self.page_num > 1 else []) + [NEXT]
            clickables += [p["asin"].lower() for p in self.page_results()]
            return {"has_search_bar": False, "clickables": list(dict.fromkeys(clickables))}
        if self.page == ITEM:
            values = [v for group in self.product["options"].values() for v in group]
            # the original keys clickables by text: a repeated value is listed once
            return {"has_search_bar": False, "clickables": list(dict.fromkeys([BACK, PREV, *SUB_PAGES, BUY, *values]))}
        if self.page == SUB:
            return {"has_search_bar": False, "clickables": [BACK, PREV]}
        return {"has_search_bar": False, "clickables": []}

    def admissible_actions(self) -> list[str]:
        """The action strings offered to an agent, as verl-agent lists them.

        `search[<your query>]` when the page has a search bar, then `click[x]` for every clickable,
        including `click[search]` on the search page although the engine rejects that click (the
        paper's baselines show it too).
        """
        available = self.available_actions()
        actions = ["search[<your query>]"] if available["has_search_bar"] else []
        return actions + [f"click[{target}]" for target in available["clickables"]]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Execute one action string; an illegal one changes nothing (reward 0)."""
        parsed = parse_action(action)
        legal = False
        if parsed is not None and not self.done:
            verb, argument = parsed
            if verb == "search":
                legal = self.search(argument)
            elif verb == "click":
                legal = self.click(argument)
        reward = self.reward if (legal and self.done) else 0.0
        return self.observation(), reward, self.done, {"legal": legal, "page": self.page}

    def search(self, keywords: str) -> bool:
        keywords = keywords.strip().lower()
        if not keywords or self.done or (self.page != SEARCH and not self.search_from_any_page):
            return False
        self.keywords = keywords
        self.results = [a for a in self.world.index.search(keywords) if a in self.world.by_asin]
        self.page, self.page_num, self.asin, self.options, self.sub_page = RESULTS, 1, None, {}, ""
        return True

    def click(self, target: str) -> bool:
        target = target.lower()  # not stripped: the original looks the exact text up
        if target == "search" or target not in self.available_actions()["clickables"]:
            return False
        if target == BACK:
            self.page, self.keywords, self.results, self.page_num = SEARCH, "", [], 1
            self.asin, self.options, self.sub_page = None, {}, ""
        elif self.page == RESULTS:
            if target == NEXT:
                self.page_num += 1
            elif target == PREV:
                self.page_num -= 1
            else:
                asin = next(p["asin"] for p in self.page_results() if p["asin"].lower() == target)
                self.page, self.asin, self.options = ITEM, asin, {}
        elif self.page == ITEM:
            if target == PREV:
                self.page, self.asin, self.options = RESULTS, None, {}
            elif target in SUB_PAGES:
                self.page, self.sub_page = SUB, target
            elif target == BUY:
                self.reward, self.reward_info = get_reward(self.product, self.goal, self.options, self.world.nouns)
                self.page = DONE
            else:
                # a value offered by several groups sets the last of them: the original's
                # text -> clickable map keeps the last radio button with that text
                groups = [name for name, values in self.product["options"].items() if target in values]
                self.options[groups[-1]] = target
        elif self.page == SUB and target == PREV:
            self.page, self.sub_page = ITEM, ""
        return True

    # ------------------------------------------------------------------ observation

    def segments(self) -> list[str]:
        """The visible text of the current page, in order (joined with [SEP] by `observation`)."""
        head = ["Instruction:", self.instruction]
        if self.page == SEARCH:
            parts = ["WebShop", *head, "Search"]
        elif self.page == RESULTS:
            parts = [*head, "Back to Search", f"Page {self.page_num} (Total results: {len(self.results)})"]
            parts += (["< Prev"] if self.page_num > 1 else []) + ["Next >"]
            for product in self.page_results():
                parts += [product["asin"], product["Title"], product["price_text"]]
        elif self.page == ITEM:
            product = self.product
            parts = [*head, "Back to Search", "< Prev"]
            for name, values in product["options"].items():
                parts += [name, *values]
            parts += [product["Title"], f"Price: {product['price_text']}", "Rating: N.A.",
                      "Description", "Features", "Reviews", "Buy Now"]
        elif self.page == SUB:
            product = self.product
            parts = [*head, "Back to Search", "< Prev"]
            if self.sub_page == "description":
                parts.append(product["Description"])
            elif self.sub_page == "features":
                parts += product["BulletPoints"]
            else:
                parts += [str(r) for r in product["Reviews"]]
        else:
            parts = ["Thank you for shopping with us!", "Your score (min 0.0, max 1.0)", f"{self.reward:g}"]
        return [" ".join(str(p).split()) for p in parts if str(p).strip()]

    def observation(self) -> str:
        return SEP.join(self.segments())

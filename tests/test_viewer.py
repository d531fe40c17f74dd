"""tools/viewer.py: a real two-iteration training run (tiny random Qwen2, sanity env, tips in the prompts of iteration 2)
rendered through Flask's test client and in headless Chromium; hostile text is escaped; unknown names are 404s."""
import html
import json
import re
import shutil
import threading
from pathlib import Path

import pytest

from config import load_config
from tools.viewer import main, make_app

try:
    from selenium import webdriver
except ImportError:  # only the browser test needs it; it is skipped then
    webdriver = None

ROOT = Path(__file__).resolve().parents[1]
SANITY = str(ROOT / "configs" / "sanity_empo2.yaml")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


def unescaped(response) -> str:
    """A page's HTML with entities decoded: the text a reader sees, for comparing with the raw records."""
    return html.unescape(response.get_data(as_text=True))


def squeeze(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_folder) -> Path:
    """Two iterations, both on-policy with tips, on the one training variation: iteration 1 fills the memory, so
    every prompt of iteration 2 holds tips. Every episode is logged; a checkpoint after each iteration."""
    from train import train

    out = tmp_path_factory.mktemp("viewer") / "run"
    train(load_config(SANITY, [
        f"--model.name_or_path={tiny_folder}", f"--output_dir={out}", "--train.iterations=2",
        "--train.log_episodes=-1", "--memory.p_no_memory=0", "--memory.p_on_policy_tips=1",
        "--memory.p_off_policy=0", "--env.sanity.train_variations=1", "--rollout.group_size=2",
        "--env.sanity.max_steps=2", "--rollout.max_action_tokens=6", "--rollout.tip_max_tokens=6",
        "--train.eval_every=0", "--train.tensorboard=false", "--train.torch_threads=1", "--train.save_every=1"]))
    return out


def episode_with_tips(run_dir: Path) -> tuple[int, dict, int]:
    """(index, record, step) of an iteration-2 episode that wrote a tip and had tips in the prompt at `step`."""
    lines = (run_dir / "episodes" / "iter_000002_rank0.jsonl").read_text().splitlines()
    for index, record in enumerate(map(json.loads, lines)):
        steps = [t for t, block in enumerate(record["tips_shown"]) if block.strip() and t < len(record["actions"])]
        if record["tip"].strip() and steps:
            return index, record, steps[0]
    pytest.fail("no episode of iteration 2 both wrote a tip and had tips in its prompt")


@pytest.mark.slow
def test_a_real_run_renders_iterations_steps_tips_and_memory(run_dir):
    client = make_app(run_dir).test_client()
    index_page = client.get("/").get_data(as_text=True)
    for name in ("iter_000001_rank0", "iter_000002_rank0"):
        assert f'href="/episodes/{name}"' in index_page
    assert "on_policy_tips" in index_page and 'href="/memory/iter_000002"' in index_page

    listing = client.get("/episodes/iter_000002_rank0").get_data(as_text=True)
    played = len((run_dir / "episodes" / "iter_000002_rank0.jsonl").read_text().splitlines())
    assert sorted(set(re.findall(r'href="/episodes/iter_000002_rank0/(\d+)"', listing)), key=int) == \
        [str(i) for i in range(played)]

    index, record, step = episode_with_tips(run_dir)
    response = client.get(f"/episodes/iter_000002_rank0/{index}")
    assert response.status_code == 200
    raw, shown = response.get_data(as_text=True), unescaped(response)
    assert record["observations"][step] in shown and record["actions"][step] in shown
    assert record["tips_shown"][step].strip() in shown
    assert "<tip>" in record["tips_shown"][step] and "<tip>" not in raw and "&lt;tip&gt;" in raw  # escaped
    assert shown.index("Tip written afterwards") < shown.rindex(record["tip"])
    assert record["final_observation"] in shown

    memory = json.loads((run_dir / "checkpoints" / "iter_000002" / "memory.json").read_text())
    key, entries = next(iter(memory["entries"].items()))
    memory_page = unescaped(client.get("/memory/iter_000002"))
    assert key in memory_page and entries[0]["tip"] in memory_page and entries[0]["action"] in memory_page
    assert client.get("/memory/run").status_code == 404  # a training run has no top-level memory.json


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.skipif(webdriver is None, reason="selenium is not installed")
@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="chromium / chromedriver not installed")
def test_the_episode_page_in_headless_chromium_shows_the_written_tip(run_dir, tmp_path):
    from selenium.webdriver.common.by import By
    from werkzeug.serving import make_server

    index, record, step = episode_with_tips(run_dir)
    server = make_server("127.0.0.1", 0, make_app(run_dir), threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    driver = None
    try:
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     f"--user-data-dir={tmp_path / 'profile'}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(30)
        driver.get(f"http://127.0.0.1:{server.server_port}/episodes/iter_000002_rank0/{index}")
        page_text = squeeze(driver.find_element(By.TAG_NAME, "body").text)
        assert squeeze(record["tip"]) in page_text
        assert squeeze(record["tips_shown"][step]) in page_text  # "<tip> ..." shows as text, not as markup
    finally:
        if driver is not None:
            driver.quit()
        server.shutdown()
        thread.join(timeout=10)


HOSTILE = "<script>alert(1)</script>"


def test_hostile_text_is_escaped_and_unknown_names_are_404(tmp_path):
    episodes = tmp_path / "episodes"
    episodes.mkdir()
    record = {"task": f"lab/{HOSTILE}", "mode": "off_policy", "return": 1.0, "success": False, "truncated": "",
              "observations": [f"obs {HOSTILE}", "second"], "tips_shown": [HOSTILE], "actions": ['"><img src=x>'],
              "rewards": [], "intrinsic": [], "final_observation": HOSTILE, "tip": HOSTILE}
    # An episode cut short (lists of unequal lengths), then a line torn by a crash mid-write.
    (episodes / "evaluation.jsonl").write_text(json.dumps(record) + "\n" + '{"task": "lab/1", "actio')
    (episodes / "notes.jsonl").write_text(json.dumps(record) + "\n")  # present, but not a name the viewer serves
    (tmp_path / "memory.json").write_text(json.dumps({"capacity": 5, "visits": {}, "entries": {
        HOSTILE: [{"tip": HOSTILE, "action": HOSTILE, "ret": 3.0, "state": HOSTILE}]}}))
    (tmp_path / "eval.md").write_text(f"# {HOSTILE}\n")
    client = make_app(tmp_path).test_client()
    for url in ("/", "/episodes/evaluation", "/episodes/evaluation/0", "/memory/run"):
        response = client.get(url)
        assert response.status_code == 200, url
        raw = response.get_data(as_text=True)
        assert "<script>" not in raw and "<img" not in raw, url
        assert "&lt;script&gt;" in raw, url
    assert len(re.findall(r'href="/episodes/evaluation/\d+"', client.get("/episodes/evaluation").get_data(
        as_text=True))) == 1  # the torn line is skipped
    assert "Tip written afterwards" in client.get("/episodes/evaluation/0").get_data(as_text=True)
    assert "No training iterations" in client.get("/").get_data(as_text=True)
    for url in ("/episodes/notes", "/episodes/..%2Fmemory.json", "/episodes/../memory.json", "/episodes/evaluation/1",
                "/episodes/val_000001", "/memory/..%2Feval.md", "/memory/iter_000001", "/memory/x", "/nothing"):
        assert client.get(url).status_code == 404, url


def test_a_missing_run_dir_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "absent")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().count("\n") == 0

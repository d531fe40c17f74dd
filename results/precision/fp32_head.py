"""The LM head in fp32 vs bf16 (model.fp32_lm_head), on tools/smoke.py's random Qwen2.5-shaped model, CPU.

    PYTHONPATH=. python results/precision/fp32_head.py tiny|0.5b      (output: results/precision/fp32_head_*.txt)

Eight sanity-env first turns + 16 tokens sampled from the fp32 model (the same tokens for every arm) are scored
(a) by a full forward (losses.sequence_action_logprobs, as the update and `recompute` score them) and (b) along the
KV-cache decode path that samples and records behaviour log-probs (HF generate, a logits processor that forces the
tokens and records log softmax of the logits it sees, as engine.generation.RowSampler does). Printed: fp32 decode vs full
(summation order only); for bf16 with either head, full vs the fp32 model and decode vs full (mean / max |delta|,
share of bit-equal values). No min_new_tokens: its processor would mask eos and shift the recorded log-softmax.
"""
import sys, tempfile

import torch

from tools import smoke
from infra.models import load_policy
from rollout import ChatStream
from engine.generation import left_pad
from losses import sequence_action_logprobs
from envs import make_env
torch.set_num_threads(1)
size = sys.argv[1] if len(sys.argv)>1 else "tiny"
d=tempfile.mkdtemp(); folder=smoke.write_model(d+"/m",size)
cfg=smoke.smoke_config(folder,"float32",d+"/o")
m32,tok=load_policy(cfg.model); m32.eval(); chat=ChatStream(tok)
env=make_env(cfg.env)
ctxs=[chat.first_turn(env.reset(t)) for t in env.tasks("train")[:8]]
class Forced:
    def __init__(s, toks): s.toks=toks; s.t=0; s.rec=[]
    def __call__(s, ids, scores):
        ch=s.toks[:, s.t:s.t+1]; s.t+=1
        s.rec.append(torch.log_softmax(scores.float(),-1).gather(-1,ch).squeeze(-1))
        return torch.full_like(scores,float('-inf')).scatter(-1,ch,0.0)
from transformers import LogitsProcessorList
N=16
torch.manual_seed(0)
ids,mask=left_pad(ctxs,chat.pad_id)
with torch.no_grad():
    out=m32.generate(input_ids=ids,attention_mask=mask,max_new_tokens=N,min_new_tokens=N,do_sample=True,top_k=0,temperature=1.0,pad_token_id=chat.pad_id)
gen=out[:,ids.shape[1]:]
seqs=[c+g.tolist() for c,g in zip(ctxs,gen)]; masks=[[0]*len(c)+[1]*N for c in ctxs]
def full(m):
    with torch.no_grad(): lp,_=sequence_action_logprobs(m,seqs,masks,chat.pad_id,"cpu")
    return torch.stack(lp)
def decode(m):
    f=Forced(gen)
    with torch.no_grad(): m.generate(input_ids=ids,attention_mask=mask,max_new_tokens=N,eos_token_id=[151000],do_sample=False,logits_processor=LogitsProcessorList([f]),pad_token_id=chat.pad_id)
    return torch.stack(f.rec,1)
ref=full(m32); print("fp32 decode vs full", (decode(m32)-ref).abs().max().item(), "mean logp", ref.mean().item())
for head in (False, True):
    c=smoke.smoke_config(folder,"bfloat16",d+"/o",**{"model.fp32_lm_head":head})
    m,_=load_policy(c.model); m.eval()
    fu=full(m); de=decode(m)
    print("head32" if head else "head16", "full vs fp32 model: mean %.5f max %.4f"%((fu-ref).abs().mean(),(fu-ref).abs().max()),
      "| decode vs full: mean %.5f max %.4f frac_exact %.2f"%((de-fu).abs().mean(),(de-fu).abs().max(),(de==fu).float().mean()))

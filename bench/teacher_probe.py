"""Probe: which training change makes the demo teacher's transformer learn its caption words (the
position word above all) sooner. The recipe's transformer stage, cut down: the shipped VAE, a pool
of 8,192 encoded renders (cached in /tmp/probe), raw weights (no EMA), the word-swap diagnostic
every 400 steps (dmad.demo.teacher_stages.word_swap_rise; rows to /tmp/probe/NAME.jsonl).

    python bench/teacher_probe.py NAME STEPS [lr=2e-3] [layers=6] [sink=1] [lmean=0] [lstd=1] [zero=0] [share=0]

sink=0 drops SD3's 256 zero tokens from the context; lmean/lstd set the logit-normal noise levels;
zero=1 starts the adaLN modulations and the output projection at zero (DiT's adaLN-Zero); share=S
gives the shape's latent pixels S of each image's loss (teacher_stages.shape_weights; the plain
mean gives them ~16%). ~10
minutes per 1,600 steps on 2 idle cores; run one at a time. The results that set the shipped
recipe's noise levels are in resources/demo/teacher/README.md."""
import json, sys, time, os
from pathlib import Path
import torch
from diffusers import AutoencoderKL
from dmad.demo import build_teacher, SD3_ZERO_TOKENS
from dmad.demo import teacher_stages as ts
from dmad.models.repeated_tokens import install

torch.set_num_threads(2)
variant = sys.argv[1]; steps = int(sys.argv[2])
opts = dict(x.split("=") for x in sys.argv[3:])
lr = float(opts.get("lr", 2e-3)); layers = int(opts.get("layers", 6))
sink = opts.get("sink", "1") == "1"; lmean = float(opts.get("lmean", 0.0)); lstd = float(opts.get("lstd", 1.0)); zero = opts.get("zero", "0") == "1"
share = float(opts.get("share", 0))
os.makedirs("/tmp/probe", exist_ok=True)
POOL = "/tmp/probe/pool.pt"
VAE = Path(__file__).resolve().parent.parent / "resources/demo/teacher/vae"
vae = AutoencoderKL.from_pretrained(str(VAE)).eval().requires_grad_(False)
if not os.path.exists(POOL) or os.path.getmtime(POOL) < (VAE / "diffusion_pytorch_model.safetensors").stat().st_mtime:
    lat, caps = [], []
    for a in range(0, 8192, 1024):
        x, c = ts.render_batch(2**24 + a, 1024, 0, 64)
        lat.append(ts.scaled_latents(vae, x)); caps += c
    torch.save({"lat": torch.cat(lat), "caps": caps}, POOL)
d = torch.load(POOL, weights_only=True); pool, caps = d["lat"], d["caps"]
masks = torch.cat([ts.shape_masks(ts.render_batch(2**24 + a, 1024, 0, 64)[0], pool.shape[-2:]) for a in range(0, len(pool), 1024)])
pipe = build_teacher(0, layers=layers)
tr = pipe.transformer
if zero:  # DiT adaLN-Zero: modulations and the output projection start at zero
    for name, m in tr.named_modules():
        if name.endswith("norm1.linear") or name.endswith("norm1_context.linear") or name.endswith("norm_out.linear") or name == "proj_out":
            torch.nn.init.zeros_(m.weight); torch.nn.init.zeros_(m.bias)
install(tr)
text = ts.TextSide(pipe.tokenizer, pipe.text_encoder, pipe.text_encoder_2)
if not sink:
    enc = text.encode_ids
    text.encode_ids = lambda ids: (lambda e, p: (e[:, :-1], p))(*enc(ids))
    rep = 1
else:
    rep = SD3_ZERO_TOKENS
def velocity(transformer, x, sigma, emb, pooled):
    return transformer(hidden_states=x, timestep=sigma * 1000, encoder_hidden_states=emb, pooled_projections=pooled,
                       joint_attention_kwargs={"repeated_last": rep}).sample
ts.velocity = velocity
params = [{"params": list(tr.parameters()), "lr": lr},
          {"params": list(pipe.text_encoder.parameters()) + list(pipe.text_encoder_2.parameters()), "lr": lr}]
opt = torch.optim.AdamW(params, weight_decay=0.01)
gen = torch.Generator().manual_seed(1)
ids = text.ids(caps); empty = text.ids([""])[0]
t0 = time.time(); c0 = time.process_time()
out = open(f"/tmp/probe/{variant}.jsonl", "w")
for step in range(steps):
    for g in opt.param_groups:
        g["lr"] = lr * ts.lr_factor(step, 8000, 300, 0.1)
    idx = torch.randint(0, len(pool), (32,), generator=gen)
    drop = torch.rand(32, generator=gen) < 0.1
    bid = torch.where(drop[:, None], empty[None], ids[idx])
    sigma = ts.logit_normal_sigmas(32, gen, lmean, lstd)
    noise = torch.randn(pool[idx].shape, generator=gen)
    emb, pooled = text.encode_ids(bid)
    loss = ts.flow_loss(tr, pool[idx], emb, pooled, sigma, noise, ts.shape_weights(masks[idx], share) if share else None).mean()
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_([p for g in params for p in g["params"]], 1.0); opt.step()
    if (step + 1) % 400 == 0:
        tr.eval()
        sw = ts.word_swap_rise(tr, text, vae, 64, 64)
        tr.train()
        row = {"step": step + 1, "loss": round(loss.item(), 4), "wall": round(time.time() - t0), "cpu": round(time.process_time() - c0),
               "rise95": {k: v["0.95"] for k, v in sw.items()}, "rise5": {k: v["0.5"] for k, v in sw.items()}}
        out.write(json.dumps(row) + "\n"); out.flush(); print(variant, json.dumps(row), flush=True)

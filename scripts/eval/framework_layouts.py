"""How training frameworks lay out their checkpoint files, replayed into a
mount by exp_layouts.py: one writer per layout (exp_layouts.py's docstring
lists them; framework-layouts notes, section 7), and `Ctx`, the file
helpers that record what each retained file must read back as and the
daemon's xattrs per committed version."""
import argparse
import io
import json
import math
import os
import pickle
import shutil
import uuid

import common
import torch

# Samples per optimizer step of the run (the trainers' metadata records it).
BATCH = 64


def half(t, r):
    """Rank r's half of a tensor along its first dimension (a copy: torch.save
    of a view would write the whole storage)."""
    if t.dim() == 0:
        return t.clone()
    return torch.chunk(t, 2, dim=0)[r].clone()


def half_offsets(t, r):
    """Where rank r's half starts in the whole tensor (DCP chunk offsets)."""
    return [torch.chunk(t, 2, dim=0)[0].shape[0] * r] + [0] * (t.dim() - 1)


def optim_half(opt_sd, r):
    state = {i: {k: (half(v, r) if torch.is_tensor(v) and v.dim() > 0 else v) for k, v in s.items()}
             for i, s in opt_sd["state"].items()}
    return {"state": state, "param_groups": opt_sd["param_groups"]}


# --------------------------------------------------------------------------
# Writing into the mount, with what each retained file must read back as


class Ctx:
    """One layout's replay into a mount: file helpers that also keep
    `expect` ({relative path: (kind, object)}: what each retained file must
    read back as) and the per-version record of the daemon's xattrs."""

    def __init__(self, backend, root):
        self.backend, self.root = backend, root
        self.expect = {}
        self.written = []  # relative paths written by the current save
        self.versions = []  # one record per committed file version
        self.state = {}  # the layout's own memory (retention lists, ...)

    def p(self, rel):
        return os.path.join(self.root, rel)

    def _wrote(self, rel, kind, obj):
        self.expect[rel] = (kind, obj)
        if rel not in self.written:
            self.written.append(rel)

    def mkdir(self, rel):
        os.makedirs(self.p(rel), exist_ok=True)

    def torch_save(self, rel, obj):
        """torch.save straight to the final path (HF, Megatron, DeepSpeed)."""
        self.mkdir(os.path.dirname(rel))
        torch.save(obj, self.p(rel))
        self._wrote(rel, "torch", obj)

    def write_bytes(self, rel, data, kind, obj):
        self.mkdir(os.path.dirname(rel))
        with open(self.p(rel), "wb") as f:
            f.write(data)
        self._wrote(rel, kind, obj)

    def write_text(self, rel, text):
        """open('w') and write: truncates a tracker file in place."""
        self.mkdir(os.path.dirname(rel))
        with open(self.p(rel), "w") as f:
            f.write(text)
        self._wrote(rel, "bytes", text.encode())

    def rename(self, src, dst):
        os.rename(self.p(src), self.p(dst))
        moved = {}
        for rel in list(self.expect):
            if rel == src or rel.startswith(src + "/"):
                moved[dst + rel[len(src):]] = self.expect.pop(rel)
        self.expect.update(moved)
        self.written = [dst + w[len(src):] if (w == src or w.startswith(src + "/")) else w for w in self.written]

    def remove(self, rel):
        os.remove(self.p(rel))
        self.expect.pop(rel, None)

    def rmtree(self, rel):
        shutil.rmtree(self.p(rel))
        for k in [k for k in self.expect if k.startswith(rel + "/")]:
            del self.expect[k]

    def copy2(self, src, dst):
        self.mkdir(os.path.dirname(dst))
        shutil.copy2(self.p(src), self.p(dst))
        self._wrote(dst, *self.expect[src])

    def commit(self, step):
        """Waits until nothing is pending, then records each written file's
        xattrs (one version each)."""
        self.backend.wait_idle()
        for rel in self.written:
            path = self.p(rel)
            if not os.path.exists(path):
                continue
            rec = {"path": rel, "step": step, "logical_bytes": os.path.getsize(path)}
            for name in ("state", "codec", "object", "base", "chain_depth", "stored_bytes", "error"):
                try:
                    rec[name] = os.getxattr(path, "user.ckptfs." + name).decode()
                except OSError:
                    rec[name] = None
            rec["stored_bytes"] = int(rec["stored_bytes"]) if rec["stored_bytes"] else None
            rec["chain_depth"] = int(rec["chain_depth"]) if rec["chain_depth"] else 0
            self.versions.append(rec)
        self.written = []


def torch_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# --------------------------------------------------------------------------
# Layouts: each writes one checkpoint `ck` (the i-th of the run)


def one_folder(ctx, ck, i, run, keep=None):
    rel = f"run/ckpt-{ck['step']:06d}.pt"
    ctx.torch_save(rel, {"model": ck["model"], "optimizer": ck["optimizer"], "scheduler": ck["scheduler"]})
    saved = ctx.state.setdefault("saved", [])
    saved.append(rel)
    while keep and len(saved) > keep:
        ctx.remove(saved.pop(0))


def trainer_state(ck, run):
    return {"best_metric": None, "best_model_checkpoint": None, "epoch": ck["log_history"][-1]["epoch"],
            "eval_steps": 500, "global_step": ck["step"], "is_hyper_param_search": False,
            "is_local_process_zero": True, "is_world_process_zero": True, "log_history": ck["log_history"],
            "logging_steps": max(1, run["save_every"] // 10), "max_steps": run["steps"],
            "num_input_tokens_seen": 0, "num_train_epochs": math.ceil(run["steps"] / run["steps_per_epoch"]),
            "save_steps": run["save_every"], "stateful_callbacks": {}, "total_flos": 0.0,
            "train_batch_size": BATCH, "trial_name": None, "trial_params": None}


def hf_trainer(ctx, ck, i, run, safetensors=False, keep=None):
    """transformers 4.36-4.38: the checkpoint staged in tmp-checkpoint-N,
    renamed; rotation (save_total_limit) rmtrees the oldest afterwards."""
    n = ck["step"]
    tmp, final = f"run/tmp-checkpoint-{n}", f"run/checkpoint-{n}"
    if safetensors:
        ctx.mkdir(tmp)
        ctx.write_bytes(f"{tmp}/model.safetensors", common.safetensors_bytes(ck["model"], {"format": "pt"}),
                        "safetensors", ck["model"])
    else:
        ctx.torch_save(f"{tmp}/pytorch_model.bin", ck["model"])
    ctx.torch_save(f"{tmp}/optimizer.pt", ck["optimizer"])
    ctx.torch_save(f"{tmp}/scheduler.pt", ck["scheduler"])
    ctx.torch_save(f"{tmp}/rng_state.pth", ck["rng"])
    text = json.dumps(trainer_state(ck, run), indent=2, sort_keys=True) + "\n"
    ctx.write_text(f"{tmp}/trainer_state.json", text)
    ctx.rename(tmp, final)
    saved = ctx.state.setdefault("saved", [])
    saved.append(final)
    while keep and len(saved) > keep:
        ctx.rmtree(saved.pop(0))


def megatron_args(run):
    return argparse.Namespace(num_layers=3, hidden_size=run["hidden"], micro_batch_size=BATCH, lr=1e-3,
                              weight_decay=0.01, save_interval=run["save_every"], train_iters=run["steps"],
                              ckpt_format="torch", tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def megatron(ctx, ck, i, run, tp=1):
    """Megatron-LM's legacy torch format; the tracker is rewritten in place."""
    n = ck["step"]
    args = megatron_args(run)
    args.tensor_model_parallel_size = tp
    for r in range(tp):
        model = ck["model"] if tp == 1 else {k: half(v, r) for k, v in ck["model"].items()}
        optim = ck["optimizer"] if tp == 1 else optim_half(ck["optimizer"], r)
        ctx.torch_save(f"run/iter_{n:07d}/mp_rank_{r:02d}/model_optim_rng.pt", {
            "args": args, "checkpoint_version": 3.0, "iteration": n, "model": model, "optimizer": optim,
            "opt_param_scheduler": ck["scheduler"],
            "rng_state": [{"random_rng_state": ck["rng"]["python"], "np_rng_state": ck["rng"]["numpy"],
                           "torch_rng_state": ck["rng"]["cpu"], "cuda_rng_state": None, "rng_tracker_states": {}}],
            "num_floating_point_operations_so_far": float(6 * run["parameters"] * BATCH * n)})
    ctx.write_text("run/latest_checkpointed_iteration.txt", str(n))


def deepspeed(ctx, ck, i, run):
    """DeepSpeed ZeRO-2 with 2 data-parallel ranks: the model file, one
    optimizer file per rank holding its half of the flattened fp32 state."""
    n = ck["step"]
    tag = f"global_step{n}"
    ds_config = {"train_micro_batch_size_per_gpu": BATCH, "zero_optimization": {"stage": 2},
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "weight_decay": 0.01}}}
    names = list(ck["model"])
    ctx.torch_save(f"run/{tag}/mp_rank_00_model_states.pt", {
        "module": ck["model"], "buffer_names": [], "optimizer": None,
        "param_shapes": [{k: ck["model"][k].shape for k in names}], "frozen_param_shapes": None,
        "shared_params": {}, "frozen_param_fragments": None, "lr_scheduler": ck["scheduler"],
        "data_sampler": None, "random_ltd": None, "sparse_tensor_module_names": set(), "skipped_steps": 0,
        "global_steps": n, "global_samples": n * BATCH * 2, "dp_world_size": 2, "mp_world_size": 1,
        "ds_config": ds_config, "ds_version": "0.16.4"})
    st = ck["optimizer"]["state"]
    flat = {
        "weights": torch.cat([ck["model"][k].reshape(-1) for k in names]),
        "exp_avg": torch.cat([st[j]["exp_avg"].reshape(-1) for j in range(len(names))]),
        "exp_avg_sq": torch.cat([st[j]["exp_avg_sq"].reshape(-1) for j in range(len(names))]),
    }
    total = flat["weights"].numel()
    pad = total % 2
    part = (total + pad) // 2
    for k in flat:
        flat[k] = torch.cat([flat[k], torch.zeros(pad)])
    group = {k: v for k, v in ck["optimizer"]["param_groups"][0].items() if k != "params"}
    for r in range(2):
        sl = slice(r * part, (r + 1) * part)
        mapping, off = {}, 0
        for k in names:
            numel = ck["model"][k].numel()
            lo, hi = max(off, sl.start), min(off + numel, sl.stop)
            if lo < hi:
                mapping[k] = {"start": lo - sl.start, "numel": hi - lo}
            off += numel
        ctx.torch_save(f"run/{tag}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt", {
            "optimizer_state_dict": {
                "loss_scaler": None, "dynamic_loss_scale": False, "overflow": False, "clip_grad": 1.0,
                "base_optimizer_state": [{"step": st[0]["step"].clone(), "exp_avg": flat["exp_avg"][sl].clone(),
                                          "exp_avg_sq": flat["exp_avg_sq"][sl].clone()}],
                "single_partition_of_fp32_groups": [flat["weights"][sl].clone()],
                "param_groups": [dict(group, params=[0])], "zero_stage": 2, "group_paddings": [pad if r else 0],
                "partition_count": [2], "ds_version": "0.16.4", "param_slice_mappings": [mapping]},
            "ds_config": ds_config, "ds_version": "0.16.4"})
    ctx.write_text("run/latest", tag)


def dcp_items(ck, r):
    """Rank r's write items as torch.distributed.checkpoint plans them for a
    2-rank FSDP run (each tensor sharded by rows): (fqn, offsets, object);
    the replicated non-tensor objects (BYTE_IO) and 0-d tensors on rank 0,
    BYTE_IO first."""
    byte_io, tensors = [], []
    if r == 0:
        for j, g in enumerate(ck["optimizer"]["param_groups"]):
            for key, v in g.items():
                if key != "params":
                    byte_io.append((f"optimizer.param_groups.{j}.{key}", None, v))
        byte_io.append(("lr_scheduler", None, ck["scheduler"]))
        byte_io.append(("train_state", None, {"step": ck["step"], "epoch": ck["epoch"]}))
    names = list(ck["model"])
    for k, v in ck["model"].items():
        tensors.append((f"model.{k}", half_offsets(v, r), half(v, r)))
    for j, s in ck["optimizer"]["state"].items():
        for key, v in s.items():
            fqn = f"optimizer.state.{names[j]}.{key}"
            if v.dim() == 0:
                if r == 0:
                    tensors.append((fqn, [], v.clone()))
            else:
                tensors.append((fqn, half_offsets(v, r), half(v, r)))
    return byte_io + tensors


def dcp(ctx, ck, i, run):
    """torch.distributed.checkpoint (torchtitan's step-N): per rank one
    __R_0.distcp holding a torch.save zip per item at its offset, then the
    coordinator's .metadata via .metadata.tmp and a rename."""
    d = f"run/step-{ck['step']}"
    ctx.mkdir(d)
    storage, md = {}, {}
    for r in range(2):
        name = f"__{r}_0.distcp"
        data, items = bytearray(), {}
        for fqn, offsets, obj in dcp_items(ck, r):
            blob = torch_bytes(obj)
            storage[(fqn, tuple(offsets) if offsets is not None else None)] = (name, len(data), len(blob))
            items[fqn] = (len(data), len(blob), obj)
            if torch.is_tensor(obj):
                md.setdefault(fqn, {"size": list(obj.shape), "chunks": []})["chunks"].append(
                    {"offsets": offsets, "sizes": list(obj.shape)})
            data += blob
        with open(ctx.p(f"{d}/{name}"), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        ctx._wrote(f"{d}/{name}", "dcp", items)
    meta = pickle.dumps({"state_dict_metadata": md, "storage_data": storage, "planner_data": None,
                         "storage_meta": {"checkpoint_id": d, "save_id": uuid.uuid4().hex}, "version": "1.0.0"})
    with open(ctx.p(f"{d}/.metadata.tmp"), "wb") as f:
        f.write(meta)
        f.flush()
        os.fsync(f.fileno())
    os.rename(ctx.p(f"{d}/.metadata.tmp"), ctx.p(f"{d}/.metadata"))
    ctx._wrote(f"{d}/.metadata", "bytes", meta)


def lightning(ctx, ck, i, run, top_k=1):
    """Lightning 2.0-2.3 ModelCheckpoint (save_top_k=1, no monitor): torch.save
    into a buffer, one write to epoch=E-step=N.ckpt, the previous one
    removed (unless top_k is None: save_top_k=-1), last.ckpt a copy of the
    new file."""
    n, e = ck["step"], ck["epoch"]
    rel = f"run/checkpoints/epoch={e}-step={n}.ckpt"
    cb = "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': %d, " \
         "'every_n_epochs': 0, 'train_time_interval': None}" % run["save_every"]
    obj = {"epoch": e, "global_step": n, "pytorch-lightning_version": "2.3.3",
           "state_dict": {f"net.{k}": v for k, v in ck["model"].items()},
           "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"completed": e}},
                                  "epoch_loop.batch_progress": {"total": {"completed": n}}}},
           "callbacks": {cb: {"monitor": None, "best_model_score": None, "best_model_path": rel,
                              "current_score": None, "dirpath": "run/checkpoints", "last_model_path": ""}},
           "optimizer_states": [ck["optimizer"]], "lr_schedulers": [ck["scheduler"]],
           "hparams_name": "kwargs", "hyper_parameters": {"hidden": run["hidden"], "lr": 1e-3}}
    ctx.write_bytes(rel, torch_bytes(obj), "torch", obj)
    prev = ctx.state.get("prev")
    if prev and top_k == 1:
        ctx.remove(prev)
    ctx.state["prev"] = rel
    ctx.copy2(rel, "run/checkpoints/last.ckpt")


LAYOUT_FUNCS = {
    "one-folder": one_folder,
    "hf-trainer": hf_trainer,
    "hf-safetensors": lambda ctx, ck, i, run: hf_trainer(ctx, ck, i, run, safetensors=True),
    "megatron": megatron,
    "megatron-tp2": lambda ctx, ck, i, run: megatron(ctx, ck, i, run, tp=2),
    "deepspeed": deepspeed,
    "dcp": dcp,
    "lightning": lightning,
    "lightning-all": lambda ctx, ck, i, run: lightning(ctx, ck, i, run, top_k=None),
    "one-folder-keep1": lambda ctx, ck, i, run: one_folder(ctx, ck, i, run, keep=1),
    "one-folder-keep3": lambda ctx, ck, i, run: one_folder(ctx, ck, i, run, keep=3),
    "hf-trainer-keep3": lambda ctx, ck, i, run: hf_trainer(ctx, ck, i, run, keep=3),
}

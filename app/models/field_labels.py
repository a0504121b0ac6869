"""The Config form's words for the engine's keys, and the fields of its Basic view.

A field is labelled in words ("Training images"); its key (identity.train_data_dir) is in the
tooltip, with the schema's description, since that is what the JSON, `--set` and the docs use. A
key without words here is shown humanised ("lora rank"). BASIC are the fields a user changes most
(what to distil, from what, how long, how big, where to watch); the Advanced view shows every field.
"""
from __future__ import annotations

from app.models.config_doc import Key
from dmad.contract.methods import METHODS

LABELS: dict[Key, str] = {
    ("config_version",): "Config version",
    ("identity", "run_name"): "Run name",
    ("identity", "output_dir"): "Runs folder",
    ("identity", "pretrained_model_name_or_path"): "Teacher model",
    ("identity", "teacher_config_dir"): "Teacher configs (single file)",
    ("identity", "teacher_loras"): "Your LoRAs on the teacher",
    ("identity", "model_family"): "Model family",
    ("identity", "train_data_dir"): "Training images",
    ("identity", "student"): "Student weights",
    ("identity", "fake_score"): "Fake score weights",
    ("identity", "lora_rank"): "LoRA rank",
    ("identity", "lora_alpha"): "LoRA alpha",
    ("identity", "lora_targets"): "LoRA targets",
    ("resources", "mixed_precision"): "Training precision",
    ("resources", "gradient_checkpointing"): "Gradient checkpointing",
    ("resources", "teacher_precision"): "Teacher precision",
    ("resources", "share_frozen_base"): "Share one frozen base",
    ("resources", "teacher_cpu_offload"): "Teacher on the CPU",
    ("resources", "distributed"): "Several GPUs: DDP or FSDP",
    ("resources", "fsdp_shard_teacher"): "FSDP: shard the teacher",
    ("resources", "fsdp_cpu_offload"): "FSDP: offload to the CPU",
    ("resources", "train_batch_size"): "Batch size",
    ("resources", "gradient_accumulation_steps"): "Accumulation steps",
    ("resources", "resolution"): "Resolution",
    ("resources", "vae_batch_size"): "VAE batch size",
    ("resources", "cache_latents"): "Cache latents",
    ("resources", "seed"): "Seed",
    ("resources", "dataloader_num_workers"): "Data loader workers",
    ("optimization", "generator_lr"): "Student learning rate",
    ("optimization", "critic_lr"): "Critic learning rate",
    ("optimization", "optimizer"): "Optimizer",
    ("optimization", "adam_beta1"): "Adam beta 1",
    ("optimization", "adam_beta2"): "Adam beta 2",
    ("optimization", "adam_epsilon"): "Adam epsilon",
    ("optimization", "adam_weight_decay"): "Weight decay",
    ("optimization", "max_grad_norm"): "Gradient clipping",
    ("optimization", "lr_scheduler"): "Learning-rate schedule",
    ("optimization", "lr_warmup_steps"): "Warm-up iterations",
    ("optimization", "max_train_steps"): "Training iterations",
    ("distillation", "method"): "Method",
    ("distillation", "student_steps"): "Student steps",
    ("distillation", "student_timesteps"): "Student timesteps",
    ("distillation", "real_guidance_scale"): "Teacher guidance (CFG)",
    ("distillation", "critic_updates_per_generator_update"): "Critic updates per student update",
    ("distillation", "dm_weight"): "Distribution-matching weight",
    ("distillation", "generator_gan_weight"): "GAN weight (student)",
    ("distillation", "critic_gan_weight"): "GAN weight (critic)",
    ("distillation", "gan_head_placement"): "GAN head placement",
    ("distillation", "min_timestep"): "Lowest timestep",
    ("distillation", "max_timestep"): "Highest timestep",
    ("distillation", "real_guidance_max_timestep"): "Guidance up to timestep",
    ("distillation", "ema_decay"): "Student EMA decay",
    ("distillation", "regression_weight"): "Regression weight (DMD1)",
    ("distillation", "regression_images"): "Regression images per batch",
    ("distillation", "regression_teacher_steps"): "Regression teacher steps",
    ("observation", "log_every_steps"): "Log every (iterations)",
    ("observation", "checkpointing_steps"): "Checkpoint every (iterations)",
    ("observation", "checkpoints_total_limit"): "Checkpoints kept",
    ("observation", "validation_steps"): "Samples every (iterations)",
    ("observation", "prompt_set"): "Prompt set",
    ("observation", "resume_from_checkpoint"): "Resume from",
    ("observation", "gpu_mem_interval_s"): "GPU memory reading every (s)",
    ("observation", "report_to"): "Also log to",
    ("observation", "health", "alerts"): "Health alerts",
    ("observation", "health", "stop_on_alert"): "Stop on a health alert",
}

BASIC: tuple[Key, ...] = (
    ("identity", "pretrained_model_name_or_path"), ("identity", "teacher_loras"), ("identity", "train_data_dir"),
    ("identity", "run_name"), ("identity", "student"), ("distillation", "method"),
    ("distillation", "student_steps"), ("resources", "resolution"), ("resources", "train_batch_size"),
    ("resources", "mixed_precision"), ("resources", "gradient_checkpointing"), ("optimization", "max_train_steps"),
    ("optimization", "generator_lr"), ("observation", "checkpointing_steps"), ("observation", "prompt_set"),
)


def _method_words(key: Key) -> str:
    """A setting one method alone reads (its MethodInfo.settings) and that has no words here: the
    method's short name, then the rest of the key in words ("<method>: ddim timesteps"). The app never
    names a method itself (tests/engine/test_method_units.py)."""
    for info in METHODS.values():
        if key in info.settings:
            rest = key[-1].removeprefix(info.name + "_")
            return f"{info.short}: {rest.replace('_', ' ')}"
    return ""


def label_of(key: Key) -> str:
    """The words for `key` (a method's own setting by its method; humanised when it has none)."""
    return LABELS.get(key) or _method_words(key) or key[-1].replace("_", " ").capitalize()

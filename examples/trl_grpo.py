"""specroll as the rollout backend of your own TRL GRPOTrainer (in-process engine + online drafter)."""
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from specroll.demo.model_cache import load_or_build_demo_models
from specroll.demo.reward import make_reward
from specroll.demo.task import make_prompts
from specroll.integrations.local_backend import LocalBackend
from specroll.integrations.trl_hook.rollout_func import SpecrollRolloutFunc
from specroll.online_drafter import LearnerConfig
from specroll.rollout import EngineConfig

demo = load_or_build_demo_models()  # or AutoModelForCausalLM.from_pretrained(...) for your own pair
backend = LocalBackend.from_models(demo.target, demo.drafter, EngineConfig(gamma="auto"), LearnerConfig())
policy = type(demo.target).from_pretrained(demo.path / "target")  # the trainer's own copy
args = GRPOConfig(output_dir="grpo_out", max_steps=4, num_generations=4, per_device_train_batch_size=16,
                  max_completion_length=96, use_cpu=True, bf16=False, report_to="none")
trainer = GRPOTrainer(model=policy, reward_funcs=make_reward(), args=args, processing_class=demo.tokenizer,
                      train_dataset=Dataset.from_dict({"prompt": make_prompts(256, seed=0)}),
                      rollout_func=SpecrollRolloutFunc(backend))
trainer.train()

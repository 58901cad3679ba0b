"""Trainers: the shared RL loop, SFT / LoRA, DPO-on-ELBO / VRPO, and one plug-in file per RL algorithm."""

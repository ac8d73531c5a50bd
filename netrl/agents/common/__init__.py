"""The parts the built-in agents share, as Stable-Baselines3's ``common/``: no agent imports another
agent's module.

:mod:`~netrl.agents.common.encoders` (observations into features: flat vectors, one-hot leaves,
stacked frames), :mod:`~netrl.agents.common.networks` (MLPs and the twin critics),
:mod:`~netrl.agents.common.distributions` (squashed and clipped Gaussians, a categorical per action
branch), :mod:`~netrl.agents.common.masks` (the ``action_mask`` entry of an observation) and
:mod:`~netrl.agents.common.actors` (the squashed Gaussian MLP actor of SAC and its image variant).
"""

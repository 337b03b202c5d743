"""A JAX loop (linear regression, SGD with momentum) saved through respawnkit.jax (Orbax): see harness.py."""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp

from respawnkit.jax import OrbaxCheckpointer
from tests.frameworks import uploads


def loss_of(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


@jax.jit
def train_step(state: dict, step: jax.Array) -> tuple[dict, jax.Array]:
    kx, kn = jax.random.split(jax.random.PRNGKey(step))
    x = jax.random.normal(kx, (32, 8))
    y = x @ jnp.arange(8.0) + 0.1 * jax.random.normal(kn, (32,))
    params = {"w": state["w"], "b": state["b"]}
    loss, grads = jax.value_and_grad(loss_of)(params, x, y)
    momentum = {k: 0.9 * state[f"m_{k}"] + grads[k] for k in params}
    new = {k: params[k] - 0.01 * momentum[k] for k in params}
    return {**new, **{f"m_{k}": v for k, v in momentum.items()}}, loss


def main() -> int:
    uploads.install()
    state = {"w": jnp.zeros(8), "b": jnp.zeros(()), "m_w": jnp.zeros(8), "m_b": jnp.zeros(())}
    ckpt = OrbaxCheckpointer(every_s=None, every_steps=int(os.environ.get("SAVE_EVERY", "5")))
    state, start = ckpt.resume(state, download_to=os.path.join(os.environ["WORK"], "resume"))
    for step in range(start + 1, int(os.environ["STEPS"]) + 1):
        state, loss = train_step(state, step)
        print(f"step {step} loss {float(loss)!r}", flush=True)
        time.sleep(float(os.environ.get("STEP_S", "0")))
        if ckpt.step_end(step, state):
            return 143
    ckpt.saver.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

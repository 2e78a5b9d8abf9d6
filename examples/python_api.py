"""Run the Quickstart campaign from Python."""
import fleetsieve_bayes as fsb

campaign = fsb.load_campaign("examples/h100_31b_fp8/campaign.toml")
result = fsb.run_campaign(campaign, out="runs/h100")  # strategy=, seed=, prior=, preset=: names or objects
print(result.status, result.gpu_seconds)
for name, a in result.allocation.items():
    print(name, a.tp, a.load, a.replicas)

# The loop by hand, one pure round per step:
#   import jax
#   state = fsb.init(campaign, seed=0)
#   settings = fsb.DecisionSettings.from_campaign(campaign)
#   key = jax.random.PRNGKey(0)
#   while not state.done:
#       key, sub = jax.random.split(key)
#       state, out = fsb.step(state, settings, sub)

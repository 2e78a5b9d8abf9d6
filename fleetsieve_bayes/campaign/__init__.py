"""A campaign: its file, its append-only journal, the one-at-a-time and pool drivers over the round, and what its directory shows."""

from fleetsieve_bayes.exports import lazy_exports

_OWNERS = {
    "Campaign": "fleetsieve_bayes.campaign.config",
    "load_campaign": "fleetsieve_bayes.campaign.config",
    "run_campaign": "fleetsieve_bayes.campaign.runner",
    "CampaignResult": "fleetsieve_bayes.campaign.outputs",
    "RunHooks": "fleetsieve_bayes.campaign.hooks",
    "read_journal": "fleetsieve_bayes.campaign.journal",
    "load_campaign_dir": "fleetsieve_bayes.campaign.directory",
}
__all__ = sorted(_OWNERS)
__getattr__, __dir__ = lazy_exports(__name__, _OWNERS)

"""A campaign: its configuration, its append-only journal and the measure-fit-decide loop."""

"""From posterior to decision: credible bounds, the certificate, the initial design, acquisition and baseline strategies."""

"""From posterior to decision: the interval and table rules, credible bounds, the certificate, the initial design, the acquisition kernel and the strategies."""

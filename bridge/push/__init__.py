"""Web Push (issue #39; docs/api.md "Push subscriptions"): browsers' subscriptions checked
(rules.py), VAPID and message encryption (keys.py), deliveries (sender.py)."""

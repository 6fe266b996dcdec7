"""Notification preferences, the verified e-mail channel, the mail outbox and SMTP delivery."""

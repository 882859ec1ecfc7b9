"""Scripts, styles and the page of the dashboard, served by the app itself (no CDN)."""

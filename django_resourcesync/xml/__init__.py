"""Writing and reading ResourceSync documents (sitemap ``<urlset>`` and ``<sitemapindex>``)."""

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
RS_NS = "http://www.openarchives.org/rs/terms/"

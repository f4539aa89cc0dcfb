"""Charts drawn on the server as SVG: nothing for the browser to fetch, no script, no CDN.

:func:`activity_svg` draws a set's change activity (:class:`~django_resourcesync.overview.Activity`)
as one stacked bar a day: created, updated, deleted. Each bar has a ``<title>`` (the browser's
tooltip) with the day's counts, and the figure an accessible label.
"""

from html import escape

from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from django.utils.translation import gettext as _

#: The kinds of change, bottom to top, and their colours (distinct for the colour-blind too).
KINDS = (("created", "#1b7f3b"), ("updated", "#1f5fbf"), ("deleted", "#c0392b"))


def activity_svg(activity, *, width=600, height=160, detailed=True):
    """The chart of ``activity``: ``detailed`` adds the scale, the first and last day and a
    legend (the set's page); without, a small sparkline (the list of sets)."""
    days = activity.days
    top = max([sum(activity.of(day).values()) for day in days] + [1])
    left, bottom, head = (36, 34, 8) if detailed else (0, 0, 0)
    plot_width, plot_height = width - left - 4, height - bottom - head
    slot = plot_width / len(days)
    # The bars are a good part of what the list of sets costs (30 a set): written as text, the
    # day's line translated once and escaped as Django escapes (every other value is a number,
    # a date or one of KINDS).
    line = _("%(day)s: %(created)d created, %(updated)d updated, %(deleted)d deleted")
    bar_width = f"{slot * 0.76:.1f}"
    bars = []
    for index, day in enumerate(days):
        counts = activity.of(day)
        x = left + index * slot + slot * 0.12
        y = head + plot_height
        rects = []
        for kind, colour in KINDS:
            n = counts.get(kind, 0)
            if not n:
                continue
            h = plot_height * n / top
            y -= h
            rects.append(f'<rect class="{kind}" x="{x:.1f}" y="{y:.1f}" width="{bar_width}" height="{h:.1f}" fill="{colour}"/>')
        iso = day.isoformat()
        title = escape(line % {"day": iso, **{kind: counts.get(kind, 0) for kind, _colour in KINDS}})
        bars.append(
            f'<g class="day" data-day="{iso}"><title>{title}</title><rect x="{left + index * slot:.1f}" y="{head}" '
            f'width="{slot:.1f}" height="{plot_height}" fill="transparent"/>{"".join(rects)}</g>'
        )
    parts = [mark_safe("".join(bars))]
    if detailed:
        base = head + plot_height
        parts.append(format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#888"/>'
            '<text x="{}" y="{}" font-size="11" text-anchor="end" fill="#555">{}</text>'
            '<text x="{}" y="{}" font-size="11" text-anchor="end" fill="#555">0</text>'
            '<text x="{}" y="{}" font-size="11" fill="#555">{}</text>'
            '<text x="{}" y="{}" font-size="11" text-anchor="end" fill="#555">{}</text>',
            left, base, width - 4, base,
            left - 4, head + 10, top,
            left - 4, base,
            left, base + 14, days[0].isoformat(),
            width - 4, base + 14, days[-1].isoformat(),
        ))
        legend = [
            (left + 90 * i, base + 30, colour, left + 90 * i + 14, base + 30, _(kind)) for i, (kind, colour) in enumerate(KINDS)
        ]
        parts.append(format_html_join(
            "", '<rect x="{}" y="{}" width="10" height="10" transform="translate(0,-9)" fill="{}"/>'
                '<text x="{}" y="{}" font-size="11" fill="#333">{}</text>', legend,
        ))
    label = _("Changes per day over the last %(days)d days: %(total)d in all") % {"days": len(days), "total": activity.total}
    return format_html(
        '<svg class="resourcesync-activity" xmlns="http://www.w3.org/2000/svg" width="{}" height="{}" '
        'viewBox="0 0 {} {}" role="img" aria-label="{}">{}</svg>',
        width, height, width, height, label, mark_safe("".join(parts)),
    )

<?xml version="1.0" encoding="UTF-8"?>
<!--
  django-resourcesync: ResourceSync documents (ANSI/NISO Z39.99-2017) as pages for people.

  A document names this stylesheet in an xml-stylesheet instruction (RESOURCESYNC["STYLESHEET"]);
  a browser that opens it applies it and shows a page: what kind of document it is, its dates and
  links, and a table of its entries. Destinations read the XML itself and skip the instruction.

  XSLT 1.0 (what browsers run), no script, nothing fetched from elsewhere. A column is shown when
  some entry has a value for it. For long documents (up to 50,000 entries) the entries go into
  tables of ROWS rows, each laid out by the browser only when it comes into view
  (content-visibility), and each row is kept to a few elements: the page of a full document
  stays quick to open and to scroll, and the browser's find still searches every entry.
-->
<xsl:stylesheet version="1.0"
    xmlns:xsl="http://www.w3.org/1999/XSL/Transform"
    xmlns:sm="http://www.sitemaps.org/schemas/sitemap/0.9"
    xmlns:rs="http://www.openarchives.org/rs/terms/"
    exclude-result-prefixes="sm rs">

  <xsl:output method="html" encoding="UTF-8" indent="no" doctype-system="about:legacy-compat"/>

  <!-- Rows in one table of the page. -->
  <xsl:variable name="ROWS" select="500"/>

  <xsl:variable name="root" select="/*"/>
  <xsl:variable name="capability" select="string($root/rs:md/@capability)"/>
  <xsl:variable name="is-index" select="boolean(/sm:sitemapindex)"/>
  <xsl:variable name="entries" select="$root/sm:url | $root/sm:sitemap"/>
  <xsl:variable name="kind">
    <xsl:call-template name="kind">
      <xsl:with-param name="capability" select="$capability"/>
      <xsl:with-param name="index" select="$is-index"/>
    </xsl:call-template>
  </xsl:variable>

  <!-- The columns this document needs: each is shown when at least one entry has a value. -->
  <xsl:variable name="has-capability" select="boolean($entries/rs:md/@capability)"/>
  <xsl:variable name="has-change" select="boolean($entries/rs:md/@change)"/>
  <xsl:variable name="has-lastmod" select="boolean($entries/sm:lastmod)"/>
  <xsl:variable name="has-span" select="boolean($entries/rs:md/@at | $entries/rs:md/@completed | $entries/rs:md/@from | $entries/rs:md/@until)"/>
  <xsl:variable name="has-length" select="boolean($entries/rs:md/@length)"/>
  <xsl:variable name="has-type" select="boolean($entries/rs:md/@type)"/>
  <xsl:variable name="has-hash" select="boolean($entries/rs:md/@hash)"/>
  <xsl:variable name="has-path" select="boolean($entries/rs:md/@path)"/>
  <xsl:variable name="has-links" select="boolean($entries/rs:ln)"/>

  <xsl:template match="/">
    <html lang="en">
      <head>
        <meta name="viewport" content="width=device-width, initial-scale=1"/>
        <title><xsl:value-of select="$kind"/> (ResourceSync)</title>
        <style>
          body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
                 margin: 0; color: #1d2430; background: #f6f7f9; }
          header { background: #fff; border-bottom: 1px solid #d9dde3; padding: 1.2em 2em 1em; }
          main { padding: 1em 2em 1.5em; }
          .eyebrow { margin: 0; font-size: 12px; letter-spacing: .08em; text-transform: uppercase; color: #5b6472; }
          h1 { margin: .1em 0 .2em; font-size: 26px; font-weight: 600; }
          .about { margin: 0 0 .8em; color: #3c4452; max-width: 60em; }
          dl.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2em 1.2em; margin: .4em 0 0; }
          dl.facts dt { color: #5b6472; }
          dl.facts dd { margin: 0; overflow-wrap: anywhere; }
          a { color: #0b57b0; }
          a:visited { color: #6a3aa8; }
          code, .mono, td.hash, td.path { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; }
          code { font-size: 13px; }
          .label { color: #5b6472; }
          .count { margin: 0 0 .6em; font-weight: 600; }
          .rows { content-visibility: auto; contain-intrinsic-size: auto 20000px; }
          .rows + .rows { margin-top: -1px; }
          table { border-collapse: collapse; width: 100%; min-width: 60em; table-layout: fixed; font-size: 14px;
                  background: #fff; border: 1px solid #d9dde3; }
          th, td { text-align: left; vertical-align: top; padding: .35em .6em; border-bottom: 1px solid #eceef2; }
          th { position: sticky; top: 0; background: #eef1f5; font-weight: 600; font-size: 13px; color: #3c4452;
               border-bottom: 1px solid #d9dde3; }
          tbody tr:nth-child(even) { background: #fafbfc; }
          tbody tr:hover { background: #eef5ff; }
          .n { width: 4em; text-align: right; color: #5b6472; }
          td.loc { overflow-wrap: anywhere; }
          .capability { width: 13em; }
          .change { width: 5.5em; }
          .when, .lastmod { width: 11em; white-space: nowrap; }
          .span { width: 15em; white-space: nowrap; }
          .length { width: 6em; }
          td.length { text-align: right; white-space: nowrap; }
          .type { width: 9em; overflow-wrap: anywhere; }
          .hash { width: 12em; }
          td.hash { font-size: 12.5px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
          .path { width: 11em; }
          td.path { font-size: 12.5px; overflow-wrap: anywhere; }
          .links { width: 10em; }
          td.links a { margin-right: .6em; white-space: nowrap; }
          .created { color: #17692b; font-weight: 600; }
          .updated { color: #8a5a00; font-weight: 600; }
          .deleted { color: #b3261e; font-weight: 600; }
          .empty { padding: 1em; color: #5b6472; background: #fff; border: 1px solid #d9dde3; }
          footer { padding: 0 2em 2em; color: #5b6472; font-size: 13px; max-width: 60em; }
        </style>
      </head>
      <body>
        <xsl:choose>
          <xsl:when test="/sm:urlset or /sm:sitemapindex">
            <xsl:call-template name="page"/>
          </xsl:when>
          <xsl:otherwise>
            <main><p>This is not a ResourceSync document (a sitemap <code>urlset</code> or <code>sitemapindex</code>).</p></main>
          </xsl:otherwise>
        </xsl:choose>
      </body>
    </html>
  </xsl:template>

  <xsl:template name="page">
    <header>
      <p class="eyebrow">ResourceSync document</p>
      <h1><xsl:value-of select="$kind"/></h1>
      <p class="about">
        <xsl:call-template name="about">
          <xsl:with-param name="capability" select="$capability"/>
          <xsl:with-param name="index" select="$is-index"/>
        </xsl:call-template>
      </p>
      <dl class="facts">
        <xsl:if test="$capability">
          <dt>Capability</dt>
          <dd><code><xsl:value-of select="$capability"/></code></dd>
        </xsl:if>
        <xsl:for-each select="$root/rs:md/@at | $root/rs:md/@completed | $root/rs:md/@from | $root/rs:md/@until">
          <dt><xsl:call-template name="date-name"><xsl:with-param name="name" select="local-name()"/></xsl:call-template></dt>
          <dd><xsl:call-template name="datetime"><xsl:with-param name="value" select="."/></xsl:call-template></dd>
        </xsl:for-each>
        <xsl:if test="$root/rs:md and not($root/rs:md/@until) and ($capability = 'changelist' or $capability = 'changedump')">
          <dt>Until <code class="label">(until)</code></dt>
          <dd>none: it is still being extended</dd>
        </xsl:if>
        <xsl:for-each select="$root/rs:ln">
          <dt><xsl:call-template name="rel-name"><xsl:with-param name="rel" select="@rel"/></xsl:call-template></dt>
          <dd>
            <xsl:call-template name="link">
              <xsl:with-param name="href" select="@href"/>
              <xsl:with-param name="text" select="@href"/>
            </xsl:call-template>
            <xsl:if test="@type"><span class="label"> (<xsl:value-of select="@type"/>)</span></xsl:if>
          </dd>
        </xsl:for-each>
      </dl>
    </header>
    <main>
      <p class="count">
        <xsl:value-of select="format-number(count($entries), '#,##0')"/>
        <xsl:choose>
          <xsl:when test="count($entries) = 1"> entry</xsl:when>
          <xsl:otherwise> entries</xsl:otherwise>
        </xsl:choose>
      </p>
      <xsl:for-each select="$entries[position() mod $ROWS = 1]">
        <div class="rows">
          <table>
            <xsl:call-template name="headings"/>
            <tbody>
              <xsl:apply-templates select=". | following-sibling::sm:url[position() &lt; $ROWS] | following-sibling::sm:sitemap[position() &lt; $ROWS]">
                <xsl:with-param name="before" select="(position() - 1) * $ROWS"/>
              </xsl:apply-templates>
            </tbody>
          </table>
        </div>
      </xsl:for-each>
      <xsl:if test="not($entries)">
        <p class="empty">No entries.</p>
      </xsl:if>
    </main>
    <footer>
      A ResourceSync document (ANSI/NISO Z39.99-2017) shown through the Source's stylesheet. Its XML is
      what Destinations read, unchanged: the browser's "view page source" shows it. Dates are in UTC;
      sizes in units of 1,024 bytes. Hover over a shortened value to read it whole.
    </footer>
  </xsl:template>

  <xsl:template name="headings">
    <thead>
      <tr>
        <th class="n">#</th>
        <th class="loc">
          <xsl:choose>
            <xsl:when test="$is-index">Document</xsl:when>
            <xsl:otherwise>Location</xsl:otherwise>
          </xsl:choose>
        </th>
        <xsl:if test="$has-capability"><th class="capability">Capability</th></xsl:if>
        <xsl:if test="$has-change"><th class="change">Change</th><th class="when">Changed at (UTC)</th></xsl:if>
        <xsl:if test="$has-lastmod"><th class="lastmod">Last modified (UTC)</th></xsl:if>
        <xsl:if test="$has-span"><th class="span">Covers (UTC)</th></xsl:if>
        <xsl:if test="$has-length"><th class="length">Size</th></xsl:if>
        <xsl:if test="$has-type"><th class="type">Media type</th></xsl:if>
        <xsl:if test="$has-hash"><th class="hash">Hashes</th></xsl:if>
        <xsl:if test="$has-path"><th class="path">Path in package</th></xsl:if>
        <xsl:if test="$has-links"><th class="links">Links</th></xsl:if>
      </tr>
    </thead>
  </xsl:template>

  <!-- One row per entry; "before": how many entries the tables above hold. -->
  <xsl:template match="sm:url | sm:sitemap">
    <xsl:param name="before" select="0"/>
    <xsl:variable name="md" select="rs:md"/>
    <tr>
      <td class="n"><xsl:value-of select="$before + position()"/></td>
      <td class="loc">
        <xsl:call-template name="link">
          <xsl:with-param name="href" select="normalize-space(sm:loc)"/>
          <xsl:with-param name="text" select="normalize-space(sm:loc)"/>
        </xsl:call-template>
      </td>
      <xsl:if test="$has-capability">
        <td class="capability" title="{$md/@capability}">
          <xsl:if test="$md/@capability">
            <xsl:call-template name="kind">
              <xsl:with-param name="capability" select="string($md/@capability)"/>
              <xsl:with-param name="index" select="false()"/>
            </xsl:call-template>
          </xsl:if>
        </td>
      </xsl:if>
      <xsl:if test="$has-change">
        <td class="change {$md/@change}"><xsl:value-of select="$md/@change"/></td>
        <xsl:call-template name="datetime-cell">
          <xsl:with-param name="class" select="'when'"/>
          <xsl:with-param name="value" select="$md/@datetime"/>
        </xsl:call-template>
      </xsl:if>
      <xsl:if test="$has-lastmod">
        <xsl:call-template name="datetime-cell">
          <xsl:with-param name="class" select="'lastmod'"/>
          <xsl:with-param name="value" select="sm:lastmod"/>
        </xsl:call-template>
      </xsl:if>
      <xsl:if test="$has-span">
        <td class="span">
          <xsl:for-each select="$md/@at | $md/@completed | $md/@from | $md/@until">
            <xsl:if test="position() &gt; 1"><br/></xsl:if>
            <span class="label"><xsl:value-of select="local-name()"/></span>
            <xsl:text> </xsl:text>
            <xsl:call-template name="datetime">
              <xsl:with-param name="value" select="."/>
              <xsl:with-param name="utc" select="''"/>
            </xsl:call-template>
          </xsl:for-each>
        </td>
      </xsl:if>
      <xsl:if test="$has-length">
        <xsl:choose>
          <xsl:when test="$md/@length">
            <td class="length" title="{format-number($md/@length, '#,##0')} bytes">
              <xsl:call-template name="size"><xsl:with-param name="bytes" select="$md/@length"/></xsl:call-template>
            </td>
          </xsl:when>
          <xsl:otherwise><td class="length"/></xsl:otherwise>
        </xsl:choose>
      </xsl:if>
      <xsl:if test="$has-type"><td class="type"><xsl:value-of select="$md/@type"/></td></xsl:if>
      <xsl:if test="$has-hash">
        <td class="hash" title="{$md/@hash}">
          <xsl:call-template name="hashes"><xsl:with-param name="tokens" select="normalize-space($md/@hash)"/></xsl:call-template>
        </td>
      </xsl:if>
      <xsl:if test="$has-path"><td class="path"><xsl:value-of select="$md/@path"/></td></xsl:if>
      <xsl:if test="$has-links">
        <td class="links">
          <xsl:for-each select="rs:ln">
            <xsl:call-template name="link">
              <xsl:with-param name="href" select="@href"/>
              <xsl:with-param name="text" select="@rel"/>
              <xsl:with-param name="title" select="concat(@rel, ': ', @href)"/>
            </xsl:call-template>
            <xsl:text> </xsl:text>
          </xsl:for-each>
        </td>
      </xsl:if>
    </tr>
  </xsl:template>

  <!-- A link, only to an http(s) URI (any other, javascript: say, is shown as text). -->
  <xsl:template name="link">
    <xsl:param name="href"/>
    <xsl:param name="text"/>
    <xsl:param name="title"/>
    <xsl:variable name="scheme" select="translate(substring-before($href, ':'), 'HTPS', 'htps')"/>
    <xsl:choose>
      <xsl:when test="($scheme = 'http' or $scheme = 'https') and starts-with(substring-after($href, ':'), '//')">
        <a href="{$href}">
          <xsl:if test="$title"><xsl:attribute name="title"><xsl:value-of select="$title"/></xsl:attribute></xsl:if>
          <xsl:value-of select="$text"/>
        </a>
      </xsl:when>
      <xsl:otherwise>
        <span class="mono">
          <xsl:if test="$title"><xsl:attribute name="title"><xsl:value-of select="$title"/></xsl:attribute></xsl:if>
          <xsl:value-of select="$text"/>
        </span>
      </xsl:otherwise>
    </xsl:choose>
  </xsl:template>

  <!-- A table cell with a datetime, the value as written in its tooltip. -->
  <xsl:template name="datetime-cell">
    <xsl:param name="class"/>
    <xsl:param name="value"/>
    <td class="{$class}">
      <xsl:if test="$value">
        <xsl:attribute name="title"><xsl:value-of select="$value"/></xsl:attribute>
        <xsl:call-template name="datetime">
          <xsl:with-param name="value" select="$value"/>
          <xsl:with-param name="utc" select="''"/>
        </xsl:call-template>
      </xsl:if>
    </td>
  </xsl:template>

  <!-- A W3C datetime as "2024-05-01 12:34:56 UTC" ("utc" is what is written for Z: nothing in
       the tables, whose headings say UTC); another offset as "UTC+02:00"; a date as it is. -->
  <xsl:template name="datetime">
    <xsl:param name="value"/>
    <xsl:param name="utc" select="' UTC'"/>
    <xsl:variable name="v" select="normalize-space($value)"/>
    <xsl:choose>
      <xsl:when test="contains($v, 'T')">
        <xsl:variable name="time" select="substring-after($v, 'T')"/>
        <xsl:variable name="clock" select="substring-before(concat(translate($time, 'Z+-.', '    '), ' '), ' ')"/>
        <xsl:variable name="rest" select="substring($time, string-length($clock) + 1)"/>
        <xsl:value-of select="concat(substring-before($v, 'T'), ' ', $clock)"/>
        <xsl:choose>
          <xsl:when test="substring($rest, string-length($rest)) = 'Z'"><xsl:value-of select="$utc"/></xsl:when>
          <xsl:when test="contains($rest, '+')"> UTC+<xsl:value-of select="substring-after($rest, '+')"/></xsl:when>
          <xsl:when test="contains($rest, '-')"> UTC-<xsl:value-of select="substring-after($rest, '-')"/></xsl:when>
        </xsl:choose>
      </xsl:when>
      <xsl:otherwise><xsl:value-of select="$v"/></xsl:otherwise>
    </xsl:choose>
  </xsl:template>

  <!-- A length in bytes in the largest unit it has a whole one of (1 KB = 1,024 bytes). -->
  <xsl:template name="size">
    <xsl:param name="bytes"/>
    <xsl:variable name="n" select="number($bytes)"/>
    <xsl:choose>
      <xsl:when test="string($n) = 'NaN'"><xsl:value-of select="$bytes"/></xsl:when>
      <xsl:when test="$n = 1">1 byte</xsl:when>
      <xsl:when test="$n &lt; 1024"><xsl:value-of select="format-number($n, '#,##0')"/> bytes</xsl:when>
      <xsl:when test="$n &lt; 1048576"><xsl:value-of select="format-number($n div 1024, '#,##0.0')"/> KB</xsl:when>
      <xsl:when test="$n &lt; 1073741824"><xsl:value-of select="format-number($n div 1048576, '#,##0.0')"/> MB</xsl:when>
      <xsl:when test="$n &lt; 1099511627776"><xsl:value-of select="format-number($n div 1073741824, '#,##0.0')"/> GB</xsl:when>
      <xsl:otherwise><xsl:value-of select="format-number($n div 1099511627776, '#,##0.0')"/> TB</xsl:otherwise>
    </xsl:choose>
  </xsl:template>

  <!-- "md5:… sha-256:…": a line for each hash, its first 10 digits (the cell's tooltip has them all). -->
  <xsl:template name="hashes">
    <xsl:param name="tokens"/>
    <xsl:if test="$tokens">
      <xsl:variable name="token" select="substring-before(concat($tokens, ' '), ' ')"/>
      <xsl:variable name="digits" select="substring-after($token, ':')"/>
      <xsl:value-of select="concat(substring-before($token, ':'), ' ', substring($digits, 1, 10))"/>
      <xsl:if test="string-length($digits) &gt; 10">…</xsl:if>
      <xsl:if test="substring-after($tokens, ' ')"><br/></xsl:if>
      <xsl:call-template name="hashes">
        <xsl:with-param name="tokens" select="substring-after($tokens, ' ')"/>
      </xsl:call-template>
    </xsl:if>
  </xsl:template>

  <!-- The kind of a document in words, from its capability (and its root: an index). -->
  <xsl:template name="kind">
    <xsl:param name="capability"/>
    <xsl:param name="index"/>
    <xsl:choose>
      <xsl:when test="$capability = 'description'">Source Description</xsl:when>
      <xsl:when test="$capability = 'capabilitylist'">Capability List</xsl:when>
      <xsl:when test="$capability = 'resourcelist'">Resource List</xsl:when>
      <xsl:when test="$capability = 'changelist'">Change List</xsl:when>
      <xsl:when test="$capability = 'resourcedump'">Resource Dump</xsl:when>
      <xsl:when test="$capability = 'changedump'">Change Dump</xsl:when>
      <xsl:when test="$capability = 'resourcedump-manifest'">Resource Dump Manifest</xsl:when>
      <xsl:when test="$capability = 'changedump-manifest'">Change Dump Manifest</xsl:when>
      <xsl:when test="$capability = 'resourcelist-archive'">Resource List Archive</xsl:when>
      <xsl:when test="$capability = 'resourcedump-archive'">Resource Dump Archive</xsl:when>
      <xsl:when test="$capability = 'changelist-archive'">Change List Archive</xsl:when>
      <xsl:when test="$capability = 'changedump-archive'">Change Dump Archive</xsl:when>
      <xsl:when test="$capability = 'framework-notification'">Framework Notification</xsl:when>
      <xsl:when test="$capability = 'change-notification'">Change Notification</xsl:when>
      <xsl:when test="$capability"><xsl:value-of select="$capability"/></xsl:when>
      <xsl:otherwise>Sitemap</xsl:otherwise>
    </xsl:choose>
    <xsl:if test="$index"> Index</xsl:if>
  </xsl:template>

  <!-- What a document of that kind is, in a sentence. -->
  <xsl:template name="about">
    <xsl:param name="capability"/>
    <xsl:param name="index"/>
    <xsl:choose>
      <xsl:when test="$index and $capability = 'changelist'">
        The Change Lists of this set, oldest first, each covering the period shown.
      </xsl:when>
      <xsl:when test="$index and $capability = 'changedump'">
        The parts of this set's Change Dump, oldest first, each covering the period shown.
      </xsl:when>
      <xsl:when test="$index">The parts of a document too long for one file, each listing some of its entries.</xsl:when>
      <xsl:when test="$capability = 'description'">
        What this Source publishes: a Capability List for each set of resources it keeps in sync.
      </xsl:when>
      <xsl:when test="$capability = 'capabilitylist'">
        What this set of resources offers: the documents a Destination reads to stay in sync with it.
      </xsl:when>
      <xsl:when test="$capability = 'resourcelist'">
        The resources of this set as they were at the time below, with their sizes and hashes.
      </xsl:when>
      <xsl:when test="$capability = 'changelist'">
        Changes to the resources of this set, oldest first: what was created, updated or deleted, and when.
      </xsl:when>
      <xsl:when test="$capability = 'resourcedump'">
        ZIP packages holding the content of this set's resources, each with a manifest of what it holds.
      </xsl:when>
      <xsl:when test="$capability = 'changedump'">
        ZIP packages holding the content of this set's changes, oldest first, each with a manifest.
      </xsl:when>
      <xsl:when test="$capability = 'resourcedump-manifest' or $capability = 'changedump-manifest'">
        What one package holds: for each file, the resource it is, its path in the package and its hashes.
      </xsl:when>
      <xsl:when test="contains($capability, '-archive')">
        Earlier documents of this kind that the Source keeps, oldest first, the current one too.
      </xsl:when>
      <xsl:when test="contains($capability, '-notification')">
        A notification sent to the subscribers of this set.
      </xsl:when>
      <xsl:otherwise>A sitemap document.</xsl:otherwise>
    </xsl:choose>
  </xsl:template>

  <!-- A datetime of a document's rs:md, in words (the attribute after it). -->
  <xsl:template name="date-name">
    <xsl:param name="name"/>
    <xsl:choose>
      <xsl:when test="$name = 'at'">As of</xsl:when>
      <xsl:when test="$name = 'completed'">Completed</xsl:when>
      <xsl:when test="$name = 'from'">From</xsl:when>
      <xsl:when test="$name = 'until'">Until</xsl:when>
    </xsl:choose>
    <xsl:text> </xsl:text>
    <code class="label">(<xsl:value-of select="$name"/>)</code>
  </xsl:template>

  <!-- A document's own link relation, in words (the relation after it). -->
  <xsl:template name="rel-name">
    <xsl:param name="rel"/>
    <xsl:choose>
      <xsl:when test="$rel = 'up'">Up</xsl:when>
      <xsl:when test="$rel = 'index'">Index</xsl:when>
      <xsl:when test="$rel = 'describedby'">Described by</xsl:when>
      <xsl:when test="$rel = 'hub'">Hub</xsl:when>
      <xsl:when test="$rel = 'self'">Self</xsl:when>
      <xsl:otherwise>Link</xsl:otherwise>
    </xsl:choose>
    <xsl:text> </xsl:text>
    <code class="label">(<xsl:value-of select="$rel"/>)</code>
  </xsl:template>

</xsl:stylesheet>

SELECT {columns}, {held} AS held
FROM (SELECT i.seq,
             SUM(LENGTH(i.payload)) OVER (ORDER BY i.part_seq - CASE i.part {passed} END, i.seq)
               - LENGTH(i.payload) AS bytes_before
      FROM {messages} AS i
      WHERE i.seq >= ? AND ({ranges})) AS g
JOIN {messages} AS o ON o.seq = g.seq
WHERE g.bytes_before < ?
